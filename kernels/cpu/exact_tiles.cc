// The exact tiles (tile_kernels.h): float64, one allowed (query, key) pair
// at a time, for work items whose inputs are not all finite. The SIMD tiles
// compute whole blocks and mask afterwards, so a NaN in a masked-out key
// would reach rows that must not see it (0 * NaN = NaN), and fp32 logits can
// overflow where float64 does not; here only allowed pairs are touched, in
// the arithmetic of the float64 reference (kernels/cpu/reference.h):
//
//   s_j = scale * q . k_j;  m = max_j s_j;  p_j = exp(s_j - m);  l = sum p_j
//   O = sum_j p_j v_j / l;  LSE = m + log l
//
// so a NaN score, or a +inf one (exp(inf - inf)), makes the row's O and LSE
// NaN; a NaN or infinity in v_j reaches O through p_j v_j (0 * inf is NaN);
// a row whose allowed scores are all -inf adds nothing (O = 0, LSE = -inf, as
// a masked row), which is where this differs from a literal 0 / 0.
// Backward: p_j = exp(s_j - LSE), dP_j = dO . v_j, dS_j = p_j (dP_j - Delta),
// dQ += scale dS_j k_j, dK_j += scale dS_j q, dV_j += p_j dO; rows with
// LSE = -inf add nothing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "common/mask.h"
#include "kernels/cpu/tile_kernels.h"

namespace hsap::kernels::cpu::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row `row` of a [rows, stride] tensor (at its head), widened.
void Load(const void* base, DType dtype, int64_t row, int64_t stride, int dim, double* out) {
  for (int d = 0; d < dim; ++d) out[d] = LoadAsFloat(base, dtype, row * stride + d);
}

double Dot(const double* a, const double* b, int dim) {
  double s = 0;
  for (int d = 0; d < dim; ++d) s += a[d] * b[d];
  return s;
}

}  // namespace

bool ExactForwardTile(const FwdTile& t) {
  const int D = t.head_dim;
  std::vector<double> q(D), k(D), v(D), o(D), s;
  bool any = false;
  for (int i = 0; i < t.num_rows; ++i) {
    int64_t lo, hi;
    RowKeyRange(t.type, t.offset, t.window, t.num_k, t.first_row + i, &lo, &hi);
    float* orow = t.o + static_cast<int64_t>(i) * D;
    if (lo >= hi) {
      t.lse[i] = -std::numeric_limits<float>::infinity();
      std::fill(orow, orow + D, 0.f);
      continue;
    }
    any = true;
    Load(t.q, t.dtype, i, t.q_row_stride, D, q.data());
    s.assign(hi - lo, 0.0);
    bool nan = false;
    double m = -kInf;
    for (int64_t j = lo; j < hi; ++j) {
      Load(t.k, t.dtype, j, t.kv_row_stride, D, k.data());
      const double x = Dot(q.data(), k.data(), D) * t.softmax_scale;
      s[j - lo] = x;
      if (std::isnan(x)) {
        nan = true;
      } else if (x > m) {
        m = x;
      }
    }
    if (nan || m == kInf) {
      t.lse[i] = std::numeric_limits<float>::quiet_NaN();
      std::fill(orow, orow + D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (m == -kInf) {  // every allowed score is -inf: nothing to add
      t.lse[i] = -std::numeric_limits<float>::infinity();
      std::fill(orow, orow + D, 0.f);
      continue;
    }
    double l = 0;
    std::fill(o.begin(), o.end(), 0.0);
    for (int64_t j = lo; j < hi; ++j) {
      const double p = std::exp(s[j - lo] - m);
      l += p;
      Load(t.v, t.dtype, j, t.kv_row_stride, D, v.data());
      for (int d = 0; d < D; ++d) o[d] += p * v[d];
    }
    for (int d = 0; d < D; ++d) orow[d] = static_cast<float>(o[d] / l);
    // A row that saw keys keeps an LSE fp32 can hold: beyond its range the
    // LSE saturates at +-FLT_MAX (a -inf would read as "saw nothing" and
    // zero the row's O in the merge).
    constexpr double kMax = std::numeric_limits<float>::max();
    t.lse[i] = static_cast<float>(std::clamp(m + std::log(l), -kMax, kMax));
  }
  return any;
}

bool ExactBackwardTile(const ExactBwdTile& t) {
  const int D = t.head_dim, nk = t.num_keys;
  if (t.row_begin >= t.row_end) return false;
  std::vector<double> q(D), dout(D), k(static_cast<size_t>(nk) * D), v(k.size());
  std::vector<double> dk(k.size(), 0.0), dv(k.size(), 0.0), dq(D);
  for (int j = 0; j < nk; ++j) {
    Load(t.k, t.dtype, t.first_key + j, t.kv_row_stride, D, &k[static_cast<size_t>(j) * D]);
    Load(t.v, t.dtype, t.first_key + j, t.kv_row_stride, D, &v[static_cast<size_t>(j) * D]);
  }
  const double scale = t.softmax_scale;
  for (int64_t r = t.row_begin; r < t.row_end; ++r) {
    float* dqrow = t.dq + (r - t.row_begin) * t.out_row_stride;
    std::fill(dq.begin(), dq.end(), 0.0);
    const double lse = t.lse[r];
    int64_t lo, hi;
    RowKeyRange(t.type, t.offset, t.window, t.num_k, r, &lo, &hi);
    lo = std::max(lo, t.first_key);
    hi = std::min(hi, t.first_key + nk);
    if (lse != -kInf && lo < hi) {
      Load(t.q, t.dtype, r, t.q_row_stride, D, q.data());
      Load(t.dout, t.dtype, r, t.q_row_stride, D, dout.data());
      const double delta = t.delta[r];
      for (int64_t jj = lo; jj < hi; ++jj) {
        const size_t j = static_cast<size_t>(jj - t.first_key) * D;
        const double p = std::exp(Dot(q.data(), &k[j], D) * scale - lse);
        const double ds = p * (Dot(dout.data(), &v[j], D) - delta) * scale;
        for (int d = 0; d < D; ++d) {
          dq[d] += ds * k[j + d];
          dk[j + d] += ds * q[d];
          dv[j + d] += p * dout[d];
        }
      }
    }
    for (int d = 0; d < D; ++d) dqrow[d] = static_cast<float>(dq[d]);
    std::fill(dqrow + D, dqrow + t.out_row_stride, 0.f);
  }
  for (int j = 0; j < nk; ++j) {
    float* dkrow = t.dk + j * t.out_row_stride;
    float* dvrow = t.dv + j * t.out_row_stride;
    for (int d = 0; d < D; ++d) {
      dkrow[d] = static_cast<float>(dk[static_cast<size_t>(j) * D + d]);
      dvrow[d] = static_cast<float>(dv[static_cast<size_t>(j) * D + d]);
    }
    std::fill(dkrow + D, dkrow + t.out_row_stride, 0.f);
    std::fill(dvrow + D, dvrow + t.out_row_stride, 0.f);
  }
  return true;
}

}  // namespace hsap::kernels::cpu::internal

#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hsap::kernels::cpu {
namespace {

// Widens a whole [rows, heads, dim] tensor of `dtype` to double.
std::vector<double> Widen(const void* data, DType dtype, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = LoadAsFloat(data, dtype, i);
  return out;
}

// The keys query row `row` may see: the union over all slices (a pair allowed
// by two overlapping slices still counts once), ascending.
class AllowedKeys {
 public:
  AllowedKeys(absl::Span<const MaskSlice> slices, int64_t num_k)
      : slices_(slices), marked_(static_cast<size_t>(num_k), 0) {}

  const std::vector<int64_t>& For(int64_t row) {
    for (int64_t j : keys_) marked_[j] = 0;
    keys_.clear();
    for (const MaskSlice& s : slices_) {
      if (row < s.q_begin || row >= s.q_end) continue;
      int64_t lo, hi;
      RowKeyRange(s.type, s.offset, s.window, s.num_k(), row - s.q_begin, &lo, &hi);
      for (int64_t c = lo; c < hi; ++c) {
        const int64_t j = s.k_begin + c;
        if (!marked_[j]) {
          marked_[j] = 1;
          keys_.push_back(j);
        }
      }
    }
    std::sort(keys_.begin(), keys_.end());
    return keys_;
  }

 private:
  absl::Span<const MaskSlice> slices_;
  std::vector<char> marked_;
  std::vector<int64_t> keys_;
};

// Softmax probabilities of one (row, head) over `keys`, and the LSE, in the
// plain float64 arithmetic whose NaN and infinity rules the kernels follow:
// a NaN score, or a +inf one (exp(inf - inf)), gives NaN probabilities.
// Returns -inf and leaves `p` empty when there are no keys, and when every
// score is -inf (the row then adds nothing, like a masked row).
double RowSoftmax(const AttentionShape& shape, const std::vector<double>& q,
                  const std::vector<double>& k, int64_t row, int head,
                  const std::vector<int64_t>& keys, std::vector<double>* p) {
  const int D = shape.head_dim, Hq = shape.num_heads_q, Hkv = shape.num_heads_kv;
  const int kv_head = head / (Hq / Hkv);
  p->assign(keys.size(), 0.0);
  if (keys.empty()) return -std::numeric_limits<double>::infinity();
  const double* qr = &q[(row * Hq + head) * static_cast<int64_t>(D)];
  double max_score = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (size_t n = 0; n < keys.size(); ++n) {
    const double* kr = &k[(keys[n] * Hkv + kv_head) * static_cast<int64_t>(D)];
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
    (*p)[n] = dot * static_cast<double>(shape.softmax_scale);
    nan |= std::isnan((*p)[n]);
    max_score = std::max(max_score, (*p)[n]);
  }
  if (!nan && max_score == -std::numeric_limits<double>::infinity()) {
    p->clear();
    return max_score;
  }
  double sum = 0;
  for (double& x : *p) sum += (x = std::exp(x - max_score));
  for (double& x : *p) x /= sum;
  return max_score + std::log(sum);
}

// Both backward references; `o` null means "Delta from the exact forward".
void BackwardImpl(const AttentionShape& shape, const void* q, const void* k, const void* v,
                  const void* o, const void* dout, int64_t num_q, int64_t num_k,
                  absl::Span<const MaskSlice> slices, std::vector<double>* dq,
                  std::vector<double>* dk, std::vector<double>* dv);

}  // namespace

void ReferenceForward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                      int64_t num_q, int64_t num_k, absl::Span<const MaskSlice> slices,
                      std::vector<double>* o, std::vector<double>* lse) {
  const int D = shape.head_dim, Hq = shape.num_heads_q, Hkv = shape.num_heads_kv;
  const std::vector<double> qd = Widen(q, shape.dtype, num_q * Hq * D);
  const std::vector<double> kd = Widen(k, shape.dtype, num_k * Hkv * D);
  const std::vector<double> vd = Widen(v, shape.dtype, num_k * Hkv * D);
  o->assign(static_cast<size_t>(num_q * Hq * D), 0.0);
  lse->assign(static_cast<size_t>(Hq * num_q), 0.0);
  AllowedKeys allowed(slices, num_k);
  std::vector<double> p;
  for (int64_t i = 0; i < num_q; ++i) {
    const std::vector<int64_t>& keys = allowed.For(i);
    for (int h = 0; h < Hq; ++h) {
      const int kv_head = h / (Hq / Hkv);
      (*lse)[h * num_q + i] = RowSoftmax(shape, qd, kd, i, h, keys, &p);
      double* orow = &(*o)[(i * Hq + h) * static_cast<int64_t>(D)];
      for (size_t n = 0; n < p.size(); ++n) {
        const double* vr = &vd[(keys[n] * Hkv + kv_head) * static_cast<int64_t>(D)];
        for (int d = 0; d < D; ++d) orow[d] += p[n] * vr[d];
      }
    }
  }
}

void ReferenceBackward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                       const void* dout, int64_t num_q, int64_t num_k,
                       absl::Span<const MaskSlice> slices, std::vector<double>* dq,
                       std::vector<double>* dk, std::vector<double>* dv) {
  BackwardImpl(shape, q, k, v, nullptr, dout, num_q, num_k, slices, dq, dk, dv);
}

void ReferenceBackwardFromOutput(const AttentionShape& shape, const void* q, const void* k,
                                 const void* v, const void* o, const void* dout, int64_t num_q,
                                 int64_t num_k, absl::Span<const MaskSlice> slices,
                                 std::vector<double>* dq, std::vector<double>* dk,
                                 std::vector<double>* dv) {
  BackwardImpl(shape, q, k, v, o, dout, num_q, num_k, slices, dq, dk, dv);
}

namespace {

void BackwardImpl(const AttentionShape& shape, const void* q, const void* k, const void* v,
                  const void* o, const void* dout, int64_t num_q, int64_t num_k,
                  absl::Span<const MaskSlice> slices, std::vector<double>* dq,
                  std::vector<double>* dk, std::vector<double>* dv) {
  const int D = shape.head_dim, Hq = shape.num_heads_q, Hkv = shape.num_heads_kv;
  const double scale = shape.softmax_scale;
  const std::vector<double> qd = Widen(q, shape.dtype, num_q * Hq * D);
  const std::vector<double> kd = Widen(k, shape.dtype, num_k * Hkv * D);
  const std::vector<double> vd = Widen(v, shape.dtype, num_k * Hkv * D);
  const std::vector<double> dod = Widen(dout, shape.dtype, num_q * Hq * D);
  const std::vector<double> od = o ? Widen(o, shape.dtype, num_q * Hq * D) : std::vector<double>();
  dq->assign(static_cast<size_t>(num_q * Hq * D), 0.0);
  dk->assign(static_cast<size_t>(num_k * Hkv * D), 0.0);
  dv->assign(static_cast<size_t>(num_k * Hkv * D), 0.0);
  AllowedKeys allowed(slices, num_k);
  std::vector<double> p, dp;
  for (int64_t i = 0; i < num_q; ++i) {
    const std::vector<int64_t>& keys = allowed.For(i);
    if (keys.empty()) continue;
    for (int h = 0; h < Hq; ++h) {
      const int kv_head = h / (Hq / Hkv);
      RowSoftmax(shape, qd, kd, i, h, keys, &p);
      if (p.empty()) continue;  // every score -inf: the row adds nothing
      const int64_t qoff = (i * Hq + h) * static_cast<int64_t>(D);
      const double* dorow = &dod[qoff];
      // dP_j = dO_i . V_j; Delta = sum_j P_j dP_j (= rowsum(dO * O) exactly).
      dp.assign(keys.size(), 0.0);
      double delta = 0;
      for (size_t n = 0; n < keys.size(); ++n) {
        const double* vr = &vd[(keys[n] * Hkv + kv_head) * static_cast<int64_t>(D)];
        for (int d = 0; d < D; ++d) dp[n] += dorow[d] * vr[d];
        delta += p[n] * dp[n];
      }
      if (o != nullptr) {
        delta = 0;
        for (int d = 0; d < D; ++d) delta += dorow[d] * od[qoff + d];
      }
      for (size_t n = 0; n < keys.size(); ++n) {
        const int64_t koff = (keys[n] * Hkv + kv_head) * static_cast<int64_t>(D);
        const double ds = p[n] * (dp[n] - delta) * scale;  // d loss / d (q.k)
        for (int d = 0; d < D; ++d) {
          (*dq)[qoff + d] += ds * kd[koff + d];
          (*dk)[koff + d] += ds * qd[qoff + d];
          (*dv)[koff + d] += p[n] * dorow[d];
        }
      }
    }
  }
}

}  // namespace

double MaxRelativeError(absl::Span<const double> actual, absl::Span<const double> expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::fabs(actual[i] - expected[i]);
    // NaN compares false everywhere: report it as an infinite error.
    if (!(diff <= std::numeric_limits<double>::max())) {
      if (actual[i] == expected[i]) continue;  // equal infinities
      return std::numeric_limits<double>::infinity();
    }
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::fabs(expected[i]));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

}  // namespace hsap::kernels::cpu

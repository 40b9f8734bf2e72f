// SIMD bodies of the forward and backward tiles (tile_kernels.h), written
// once with Highway and compiled for every x86 target worth having: AVX2
// (+FMA, F16C) and AVX-512 ("AVX3"), plus the portable EMU128 fallback.
// HWY_DYNAMIC_DISPATCH picks the best one the CPU supports on first call.
//
// Every matrix product is the same register-blocked micro-kernel: a tile of
// up to kTileRows rows x 2 vectors of C, fed by broadcasting one element of A
// per row and loading two vectors of B per reduction step (the sgemm
// "broadcast A, stream B" scheme). The operand layouts are chosen so that no
// K or V block ever has to be transposed in the forward pass:
//
//   forward:  S^T[j, i] = K[j, :] . Qt[:, i]     (A = K rows, B = Q^T packed once per tile)
//             O^T[d, i] = alpha[i] O^T[d, i] + sum_j V[j, d] P^T[j, i]
//             so the online softmax runs along vectors of queries (no
//             horizontal reductions) and fp32 K/V are read in place.
//   backward: S = Qs Kt, dP = dO Vt, dV += P^T dO, dK += dS^T Qs, dQ = dS K
//             with Kt, Vt, K packed once per tile (one key block) and reused
//             by every query block that sees it.
//
// Scores are kept in base 2: Q is pre-scaled by softmax_scale * log2(e), so
// the softmax needs exp2 only; LSE is converted back to natural log at the
// end.

// Superseded x86 targets are not worth the compile time.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/tile_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "hwy/highway.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "kernels/cpu/tile_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace hsap::kernels::cpu::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTileRows = 6;  // 6 x 2 accumulators + 2 B vectors + 1 broadcast fit 16 registers

enum TileMode { kOverwrite, kAccumulate, kColumnScale };

// C[r, 0:2N] (op)= sum_{k < K} A[r * ars + k * aks] * B[k * bks + 0:2N] for
// r < R. kColumnScale first multiplies C by col_scale[0:2N] (online-softmax
// rescale fused into the P.V product).
template <int R, int kMode>
HWY_INLINE void MicroTile(const float* HWY_RESTRICT a, int64_t ars, int64_t aks,
                          const float* HWY_RESTRICT b, int64_t bks, int64_t K,
                          float* HWY_RESTRICT c, int64_t crs, const float* col_scale) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF c0[R], c1[R];
  if (kMode == kOverwrite) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) c0[r] = c1[r] = hn::Zero(d);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      c0[r] = hn::LoadU(d, c + r * crs);
      c1[r] = hn::LoadU(d, c + r * crs + N);
    }
    if (kMode == kColumnScale) {
      const VF s0 = hn::LoadU(d, col_scale), s1 = hn::LoadU(d, col_scale + N);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        c0[r] = hn::Mul(c0[r], s0);
        c1[r] = hn::Mul(c1[r], s1);
      }
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const VF b0 = hn::LoadU(d, b), b1 = hn::LoadU(d, b + N);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VF ar = hn::Set(d, a[r * ars]);
      c0[r] = hn::MulAdd(ar, b0, c0[r]);
      c1[r] = hn::MulAdd(ar, b1, c1[r]);
    }
    a += aks;
    b += bks;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    hn::StoreU(c0[r], d, c + r * crs);
    hn::StoreU(c1[r], d, c + r * crs + N);
  }
}

// C[M, ncols] (op)= A[M, K] B[K, ncols] with A addressed as
// A[m * ars + k * aks], B row-major with row stride bks, C with row stride
// crs. REQUIRES: ncols a multiple of 2 * Lanes; B and C readable/writable
// to column ncols.
template <int kMode>
HWY_NOINLINE void Gemm(int64_t M, int64_t ncols, int64_t K, const float* a, int64_t ars,
                       int64_t aks, const float* b, int64_t bks, float* c, int64_t crs,
                       const float* col_scale = nullptr) {
  if (M <= 0) return;
  const DF d;
  const int64_t nt = 2 * static_cast<int64_t>(hn::Lanes(d));
  // Split M into tiles of at most kTileRows rows, as equal as possible (a
  // 128-row product gets 18 tiles of 6 and 4 of 5, not 21 of 6 and one of 2).
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  const int64_t base = M / tiles, extra = M % tiles;
  for (int64_t n0 = 0; n0 < ncols; n0 += nt) {
    const float* cs = col_scale ? col_scale + n0 : nullptr;
    int64_t m0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int rows = static_cast<int>(base + (t < extra ? 1 : 0));
      const float* at = a + m0 * ars;
      const float* bt = b + n0;
      float* ct = c + m0 * crs + n0;
      switch (rows) {
        case 6: MicroTile<6, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 5: MicroTile<5, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 4: MicroTile<4, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 3: MicroTile<3, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 2: MicroTile<2, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        default: MicroTile<1, kMode>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
      }
      m0 += rows;
    }
  }
}

// 2^x for x <= 127, exactly 0 for x < -125 (including -inf), relative error
// about 1e-8 elsewhere: x = n + f with |f| <= 1/2, 2^f by its degree-8
// Taylor polynomial, 2^n added to the exponent bits.
HWY_INLINE VF Exp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const auto underflow = x < hn::Set(d, -125.f);
  x = hn::Min(hn::Max(x, hn::Set(d, -125.f)), hn::Set(d, 127.f));
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
  VF p = hn::Set(d, 1.3215486790144307e-06f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.5252733804059841e-05f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.5403530393381608e-04f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.3333558146428443e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6181291076284772e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5504108664821580e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022650695910071e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314718055994531e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const auto bits = hn::Add(hn::BitCast(di, p), hn::ShiftLeft<23>(hn::ConvertTo(di, n)));
  return hn::IfThenZeroElse(underflow, hn::BitCast(d, bits));
}

// dst[0, n) = float(src[first, first + n)).
void ConvertImpl(const void* src, DType dtype, int64_t first, int64_t n, float* dst) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, static_cast<const float*>(src) + first, n * sizeof(float));
      return;
    case DType::kBFloat16: {
      const hn::Rebind<hwy::bfloat16_t, DF> dh;
      const auto* s = reinterpret_cast<const hwy::bfloat16_t*>(src) + first;
      for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, s + i)), d, dst + i);
      break;
    }
    case DType::kFloat16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto* s = reinterpret_cast<const hwy::float16_t*>(src) + first;
      for (; i + N <= n; i += N) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, s + i)), d, dst + i);
      break;
    }
  }
  for (; i < n; ++i) dst[i] = LoadAsFloat(src, dtype, first + i);
}

// Asks for rows [first, first + n) of a [rows, row_stride] tensor, `cols`
// elements each, to be brought into cache. K/V (forward) and Q/dO (backward)
// blocks are strided by all heads of a token, which the hardware prefetcher
// follows poorly; fetching block b + 1 while block b computes hides it.
void PrefetchRows(const void* base, DType dtype, int64_t first, int64_t n, int64_t row_stride,
                  int cols) {
  const int64_t es = DTypeSize(dtype);
  const char* p = static_cast<const char*>(base) + first * row_stride * es;
  const int64_t bytes = cols * es;
  for (int64_t r = 0; r < n; ++r, p += row_stride * es) {
    for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(p + b);
  }
}

// AddRows (tile_kernels.h), vectorised.
void AddRowsImpl(float* dst, int64_t dst_row_stride, const float* src, int64_t src_row_stride,
                 int64_t rows, int cols) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * dst_row_stride;
    const float* in = src + r * src_row_stride;
    int c = 0;
    for (; c + N <= cols; c += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, in + c), hn::LoadU(d, out + c)), d, out + c);
    }
    for (; c < cols; ++c) out[c] += in[c];
  }
}

// Per-thread scratch, grown on demand and reused across tiles.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> mem;
  size_t size = 0;
  float* Get(size_t n) {
    if (n > size) {
      mem = hwy::AllocateAligned<float>(n);
      size = n;
    }
    return mem.get();
  }
};

bool ForwardTileImpl(const FwdTile& t) {
  constexpr int BQ = kBlockQ, BK = kBlockK;
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int D = t.head_dim;
  const int rows = t.num_rows;
  // Query columns actually computed: rows rounded up to two vectors, so a
  // short document does not pay for a full block of padding.
  const int QC = (rows + 2 * N - 1) / (2 * N) * (2 * N);

  // Key range of each row (mask coordinates of the item) and their union.
  int64_t lo[BQ], hi[BQ];
  int64_t key_begin = std::numeric_limits<int64_t>::max(), key_end = 0;
  for (int i = 0; i < rows; ++i) {
    RowKeyRange(t.type, t.offset, t.window, t.num_k, t.first_row + i, &lo[i], &hi[i]);
    if (lo[i] < hi[i]) {
      key_begin = std::min(key_begin, lo[i]);
      key_end = std::max(key_end, hi[i]);
    }
  }
  if (key_begin >= key_end) return false;
  for (int i = rows; i < QC; ++i) lo[i] = hi[i] = key_begin;  // padding columns: see nothing

  thread_local Scratch scratch;
  const size_t kv_block = t.dtype == DType::kFloat32 ? 0 : static_cast<size_t>(BK) * D;
  float* qt = scratch.Get(2 * static_cast<size_t>(D) * BQ + BK * BQ + 2 * kv_block + 5 * BQ + D);
  float* ot = qt + static_cast<size_t>(D) * BQ;  // O^T [D, QC]
  float* st = ot + static_cast<size_t>(D) * BQ;  // S^T, then P^T [BK, QC]
  float* kc = st + BK * BQ;                      // converted K block [BK, D]
  float* vc = kc + kv_block;                     // converted V block [BK, D]
  float* m = vc + kv_block;                      // running max (base 2), may be -inf
  float* l = m + BQ;                             // running sum
  float* alpha = l + BQ;                         // rescale factor of this block
  float* lof = alpha + BQ;                       // per-block key bounds as floats
  float* hif = lof + BQ;
  float* qrow = hif + BQ;                        // one converted Q row [D]

  // Q^T [D, QC], pre-scaled into base-2 logits.
  const float c = t.softmax_scale * kLog2e;
  std::fill(qt, qt + static_cast<size_t>(D) * QC, 0.f);
  for (int i = 0; i < rows; ++i) {
    ConvertImpl(t.q, t.dtype, i * t.q_row_stride, D, qrow);
    for (int dd = 0; dd < D; ++dd) qt[dd * QC + i] = qrow[dd] * c;
  }
  std::fill(ot, ot + static_cast<size_t>(D) * QC, 0.f);
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < QC; i += N) {
    hn::Store(neg_inf, d, m + i);
    hn::Store(hn::Zero(d), d, l + i);
  }

  for (int64_t kb0 = key_begin; kb0 < key_end; kb0 += BK) {
    const int nk = static_cast<int>(std::min<int64_t>(BK, key_end - kb0));
    const int64_t kb1 = kb0 + nk;
    if (kb1 < key_end) {
      const int64_t next = std::min<int64_t>(BK, key_end - kb1);
      PrefetchRows(t.k, t.dtype, kb1, next, t.kv_row_stride, D);
      PrefetchRows(t.v, t.dtype, kb1, next, t.kv_row_stride, D);
    }
    bool any = false, interior = true;
    for (int i = 0; i < rows; ++i) {
      any |= lo[i] < kb1 && hi[i] > kb0;
      interior &= lo[i] <= kb0 && hi[i] >= kb1;
    }
    if (!any) continue;  // a fully masked block: skipped, not computed

    const float *kb, *vb;
    int64_t krs;
    if (t.dtype == DType::kFloat32) {
      kb = static_cast<const float*>(t.k) + kb0 * t.kv_row_stride;
      vb = static_cast<const float*>(t.v) + kb0 * t.kv_row_stride;
      krs = t.kv_row_stride;
    } else {
      for (int j = 0; j < nk; ++j) {
        ConvertImpl(t.k, t.dtype, (kb0 + j) * t.kv_row_stride, D, kc + j * D);
        ConvertImpl(t.v, t.dtype, (kb0 + j) * t.kv_row_stride, D, vc + j * D);
      }
      kb = kc;
      vb = vc;
      krs = D;
    }

    // S^T = K Q^T (base-2 logits).
    Gemm<kOverwrite>(nk, QC, D, kb, krs, 1, qt, QC, st, QC);

    if (!interior) {
      for (int i = 0; i < QC; ++i) {
        lof[i] = static_cast<float>(std::clamp<int64_t>(lo[i] - kb0, -1, BK + 1));
        hif[i] = static_cast<float>(std::clamp<int64_t>(hi[i] - kb0, -1, BK + 1));
      }
      for (int j = 0; j < nk; ++j) {
        const VF jf = hn::Set(d, static_cast<float>(j));
        for (int i = 0; i < QC; i += N) {
          VF s = hn::Load(d, st + j * QC + i);
          s = hn::IfThenElse(jf >= hn::Load(d, lof + i), s, neg_inf);
          s = hn::IfThenElse(jf < hn::Load(d, hif + i), s, neg_inf);
          hn::Store(s, d, st + j * QC + i);
        }
      }
    }

    // Online softmax along each column (query), N queries at a time.
    for (int i = 0; i < QC; i += N) {
      VF mx = neg_inf;
      for (int j = 0; j < nk; ++j) mx = hn::Max(mx, hn::Load(d, st + j * QC + i));
      const VF m_old = hn::Load(d, m + i);
      const VF m_new = hn::Max(m_old, mx);
      // A column that has seen no key yet keeps m = -inf; subtracting 0
      // instead makes every exp2 below exactly 0 rather than NaN.
      const VF m_safe = hn::IfThenZeroElse(m_new == neg_inf, m_new);
      const VF a = Exp2(d, hn::Sub(m_old, m_safe));
      VF sum = hn::Zero(d);
      for (int j = 0; j < nk; ++j) {
        const VF p = Exp2(d, hn::Sub(hn::Load(d, st + j * QC + i), m_safe));
        hn::Store(p, d, st + j * QC + i);
        sum = hn::Add(sum, p);
      }
      hn::Store(hn::MulAdd(hn::Load(d, l + i), a, sum), d, l + i);
      hn::Store(m_new, d, m + i);
      hn::Store(a, d, alpha + i);
    }

    // O^T = alpha * O^T + V^T P^T.
    Gemm<kColumnScale>(D, QC, nk, vb, 1, krs, st, QC, ot, QC, alpha);
  }

  for (int i = 0; i < rows; ++i) {
    float* orow = t.o + static_cast<int64_t>(i) * D;
    if (!(l[i] > 0.f)) {  // this row saw no key of the item
      t.lse[i] = -std::numeric_limits<float>::infinity();
      std::fill(orow, orow + D, 0.f);
      continue;
    }
    const float inv = 1.f / l[i];
    for (int dd = 0; dd < D; ++dd) orow[dd] = ot[dd * QC + i] * inv;
    t.lse[i] = static_cast<float>((m[i] + std::log2(static_cast<double>(l[i]))) * 0.6931471805599453);
  }
  return true;
}

bool BackwardTileImpl(const BwdTile& t) {
  constexpr int BQ = kBwdBlockQ, BK = kBwdBlockK;
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int D = t.head_dim;
  const int Dp = (D + 2 * N - 1) / (2 * N) * (2 * N);  // padded row length
  const int nk = t.num_keys;
  const int64_t kb0 = t.first_key;

  const int64_t row_begin = t.row_begin, row_end = t.row_end;
  if (row_begin >= row_end) return false;

  thread_local Scratch scratch;
  const size_t kt_size = static_cast<size_t>(D) * BK;
  const size_t k_block = static_cast<size_t>(BK) * Dp, q_block = static_cast<size_t>(BQ) * Dp;
  float* kt = scratch.Get(2 * kt_size + 3 * k_block + 3 * q_block + 2 * BQ * BK + 2 * BQ + Dp);
  float* vt = kt + kt_size;   // V^T [D, BK]
  float* kr = vt + kt_size;   // K [BK, Dp]
  float* dk = kr + k_block;   // dK [BK, Dp] (scaled at the end)
  float* dv = dk + k_block;   // dV [BK, Dp]
  float* qs = dv + k_block;   // Q * c [BQ, Dp]
  float* dor = qs + q_block;  // dO [BQ, Dp]
  float* dqb = dor + q_block; // dQ of one query block [BQ, Dp]
  float* p = dqb + q_block;   // P [BQ, BK]
  float* ds = p + BQ * BK;      // dP, then dS [BQ, BK]
  float* lse2 = ds + BQ * BK;   // LSE in base 2, +inf where -inf
  float* dlt = lse2 + BQ;       // Delta
  float* tmp = dlt + BQ;        // one converted row [Dp]

  // Pack the key block once: K^T and V^T for the score products, K rows for dQ.
  std::fill(kt, kt + 2 * kt_size + k_block, 0.f);
  std::fill(tmp, tmp + Dp, 0.f);
  for (int j = 0; j < nk; ++j) {
    ConvertImpl(t.k, t.dtype, (kb0 + j) * t.kv_row_stride, D, kr + j * Dp);
    for (int dd = 0; dd < D; ++dd) kt[dd * BK + j] = kr[j * Dp + dd];
    ConvertImpl(t.v, t.dtype, (kb0 + j) * t.kv_row_stride, D, tmp);
    for (int dd = 0; dd < D; ++dd) vt[dd * BK + j] = tmp[dd];
  }
  std::fill(dk, dk + 2 * k_block, 0.f);
  // Padding columns of Qs / dO stay 0 from here on.
  std::fill(qs, qs + 2 * q_block, 0.f);

  const float c = t.softmax_scale * kLog2e;
  const VF vc = hn::Set(d, c);
  const float inf = std::numeric_limits<float>::infinity();
  const VF iota = hn::Iota(d, 0.f);
  for (int64_t qb0 = row_begin; qb0 < row_end; qb0 += BQ) {
    const int rows = static_cast<int>(std::min<int64_t>(BQ, row_end - qb0));
    if (qb0 + rows < row_end) {
      const int64_t next = std::min<int64_t>(BQ, row_end - qb0 - rows);
      PrefetchRows(t.q, t.dtype, qb0 + rows, next, t.q_row_stride, D);
      PrefetchRows(t.dout, t.dtype, qb0 + rows, next, t.q_row_stride, D);
    }
    for (int i = 0; i < rows; ++i) {
      float* qrow = qs + i * Dp;
      ConvertImpl(t.q, t.dtype, (qb0 + i) * t.q_row_stride, D, qrow);
      for (int dd = 0; dd < Dp; dd += N) hn::Store(hn::Mul(hn::Load(d, qrow + dd), vc), d, qrow + dd);
      ConvertImpl(t.dout, t.dtype, (qb0 + i) * t.q_row_stride, D, dor + i * Dp);
      const float lse = t.lse[qb0 + i];
      // A row whose forward saw no key has LSE = -inf and P = 0 throughout.
      lse2[i] = lse == -inf ? inf : lse * kLog2e;
      dlt[i] = t.delta[qb0 + i];
    }

    // S = Qs K^T; P = exp2(S - LSE2), zero outside each row's key range.
    Gemm<kOverwrite>(rows, BK, D, qs, Dp, 1, kt, BK, p, BK);
    for (int i = 0; i < rows; ++i) {
      int64_t lo, hi;
      RowKeyRange(t.type, t.offset, t.window, t.num_k, qb0 + i, &lo, &hi);
      const int a = static_cast<int>(std::clamp<int64_t>(lo - kb0, 0, nk));
      const int b = static_cast<int>(std::clamp<int64_t>(hi - kb0, 0, nk));
      const VF l2 = hn::Set(d, lse2[i]);
      float* prow = p + i * BK;
      if (a == 0 && b == BK) {
        for (int j = 0; j < BK; j += N) hn::Store(Exp2(d, hn::Sub(hn::Load(d, prow + j), l2)), d, prow + j);
      } else {
        const VF va = hn::Set(d, static_cast<float>(a)), vb = hn::Set(d, static_cast<float>(b));
        for (int j = 0; j < BK; j += N) {
          const VF col = hn::Add(iota, hn::Set(d, static_cast<float>(j)));
          VF e = Exp2(d, hn::Sub(hn::Load(d, prow + j), l2));
          e = hn::IfThenElseZero(col >= va, e);
          e = hn::IfThenElseZero(col < vb, e);
          hn::Store(e, d, prow + j);
        }
      }
    }
    // dP = dO V^T; dS = P * (dP - Delta).
    Gemm<kOverwrite>(rows, BK, D, dor, Dp, 1, vt, BK, ds, BK);
    for (int i = 0; i < rows; ++i) {
      const VF dl = hn::Set(d, dlt[i]);
      for (int j = 0; j < BK; j += N) {
        const VF pv = hn::Load(d, p + i * BK + j);
        hn::Store(hn::Mul(pv, hn::Sub(hn::Load(d, ds + i * BK + j), dl)), d, ds + i * BK + j);
      }
    }
    // dV += P^T dO; dK += dS^T Qs (scaled at the end); dQ = dS K.
    Gemm<kAccumulate>(nk, Dp, rows, p, 1, BK, dor, Dp, dv, Dp);
    Gemm<kAccumulate>(nk, Dp, rows, ds, 1, BK, qs, Dp, dk, Dp);
    Gemm<kOverwrite>(rows, Dp, nk, ds, BK, 1, kr, Dp, dqb, Dp);
    float* dq = t.dq + (qb0 - row_begin) * D;
    for (int i = 0; i < rows; ++i) {
      for (int dd = 0; dd < D; ++dd) dq[i * D + dd] = dqb[i * Dp + dd] * t.softmax_scale;
    }
  }

  // dK = scale * dS^T Q = (scale / c) * dS^T Qs = ln2 * dS^T Qs.
  for (int j = 0; j < nk; ++j) {
    for (int dd = 0; dd < D; ++dd) {
      t.dk[j * D + dd] = dk[j * Dp + dd] * kLn2;
      t.dv[j * D + dd] = dv[j * Dp + dd];
    }
  }
  return true;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace hsap::kernels::cpu::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hsap::kernels::cpu::internal {

HWY_EXPORT(ForwardTileImpl);
HWY_EXPORT(BackwardTileImpl);
HWY_EXPORT(ConvertImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(AddRowsImpl);

void AddRows(float* dst, int64_t dst_row_stride, const float* src, int64_t src_row_stride,
             int64_t rows, int cols) {
  HWY_DYNAMIC_DISPATCH(AddRowsImpl)(dst, dst_row_stride, src, src_row_stride, rows, cols);
}

bool ForwardTile(const FwdTile& tile) { return HWY_DYNAMIC_DISPATCH(ForwardTileImpl)(tile); }

bool BackwardTile(const BwdTile& tile) { return HWY_DYNAMIC_DISPATCH(BackwardTileImpl)(tile); }

void ConvertToFloat(const void* src, DType dtype, int64_t first, int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(ConvertImpl)(src, dtype, first, n, dst);
}

const char* SimdTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace hsap::kernels::cpu::internal
#endif  // HWY_ONCE

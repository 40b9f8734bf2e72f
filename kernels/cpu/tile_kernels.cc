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
// rescale fused into the P.V product). KC > 0 is K known at compile time
// (the head dims and full blocks): a loop of constant length runs about 10%
// faster at K = 32..64 (measured on Zen 4: no loop-exit misprediction, no
// remainder handling).
template <int R, int kMode, int KC>
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
  const int64_t steps = KC > 0 ? KC : K;
#pragma GCC unroll 4
  for (int64_t k = 0; k < steps; ++k) {
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
template <int kMode, int KC>
HWY_NOINLINE void GemmK(int64_t M, int64_t ncols, int64_t K, const float* a, int64_t ars,
                        int64_t aks, const float* b, int64_t bks, float* c, int64_t crs,
                        const float* col_scale) {
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
        case 6: MicroTile<6, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 5: MicroTile<5, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 4: MicroTile<4, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 3: MicroTile<3, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        case 2: MicroTile<2, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
        default: MicroTile<1, kMode, KC>(at, ars, aks, bt, bks, K, ct, crs, cs); break;
      }
      m0 += rows;
    }
  }
}

// GemmK with K a compile-time constant where it is one of the usual sizes.
template <int kMode>
HWY_INLINE void Gemm(int64_t M, int64_t ncols, int64_t K, const float* a, int64_t ars,
                     int64_t aks, const float* b, int64_t bks, float* c, int64_t crs,
                     const float* col_scale = nullptr) {
  switch (K) {
    case 32: return GemmK<kMode, 32>(M, ncols, K, a, ars, aks, b, bks, c, crs, col_scale);
    case 64: return GemmK<kMode, 64>(M, ncols, K, a, ars, aks, b, bks, c, crs, col_scale);
    case 128: return GemmK<kMode, 128>(M, ncols, K, a, ars, aks, b, bks, c, crs, col_scale);
    case 256: return GemmK<kMode, 256>(M, ncols, K, a, ars, aks, b, bks, c, crs, col_scale);
    default: return GemmK<kMode, 0>(M, ncols, K, a, ars, aks, b, bks, c, crs, col_scale);
  }
}

// The forward's score product with its softmax bookkeeping fused into the
// register tile's epilogue: S^T[r, 0:2N] = sum_k K[r * ars + k] Qt[k * bks + 0:2N]
// for key rows r < R of a tile starting at block row `row0`; when `lof` is
// not null, entries whose key j = row0 + r is outside a column's
// [lof, hif) become -inf (the mask, on blocks not interior to every row);
// then stored, and the column max over the R rows merged into
// colmax[0:2N]. Saves the separate mask and max passes over S^T.
template <int R, int KC>
HWY_INLINE void ScoreTile(const float* HWY_RESTRICT a, int64_t ars, const float* HWY_RESTRICT b,
                          int64_t bks, int64_t K, float* HWY_RESTRICT c, int64_t crs, int row0,
                          const float* lof, const float* hif, float* colmax) {
  const DF d;
  const size_t N = hn::Lanes(d);
  VF c0[R], c1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = hn::Zero(d);
  const int64_t steps = KC > 0 ? KC : K;
#pragma GCC unroll 4
  for (int64_t k = 0; k < steps; ++k) {
    const VF b0 = hn::LoadU(d, b), b1 = hn::LoadU(d, b + N);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VF ar = hn::Set(d, a[r * ars]);
      c0[r] = hn::MulAdd(ar, b0, c0[r]);
      c1[r] = hn::MulAdd(ar, b1, c1[r]);
    }
    a += 1;
    b += bks;
  }
  if (lof != nullptr) {
    const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
    const VF lo0 = hn::LoadU(d, lof), lo1 = hn::LoadU(d, lof + N);
    const VF hi0 = hn::LoadU(d, hif), hi1 = hn::LoadU(d, hif + N);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VF j = hn::Set(d, static_cast<float>(row0 + r));
      c0[r] = hn::IfThenElse(hn::And(j >= lo0, j < hi0), c0[r], neg_inf);
      c1[r] = hn::IfThenElse(hn::And(j >= lo1, j < hi1), c1[r], neg_inf);
    }
  }
  VF m0 = hn::LoadU(d, colmax), m1 = hn::LoadU(d, colmax + N);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    hn::StoreU(c0[r], d, c + r * crs);
    hn::StoreU(c1[r], d, c + r * crs + N);
    m0 = hn::Max(m0, c0[r]);
    m1 = hn::Max(m1, c1[r]);
  }
  hn::StoreU(m0, d, colmax);
  hn::StoreU(m1, d, colmax + N);
}

// S^T[M, ncols] = K[M, K] Qt[K, ncols] with ScoreTile's mask and column max
// (colmax[ncols], initialised by the caller). Tiles as in GemmK.
template <int KC>
HWY_NOINLINE void ScoresK(int64_t M, int64_t ncols, int64_t K, const float* a, int64_t ars,
                          const float* b, int64_t bks, float* c, int64_t crs, const float* lof,
                          const float* hif, float* colmax) {
  const DF d;
  const int64_t nt = 2 * static_cast<int64_t>(hn::Lanes(d));
  const int64_t tiles = (M + kTileRows - 1) / kTileRows;
  const int64_t base = M / tiles, extra = M % tiles;
  for (int64_t n0 = 0; n0 < ncols; n0 += nt) {
    const float* lo = lof ? lof + n0 : nullptr;
    const float* hi = hif ? hif + n0 : nullptr;
    int m0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int rows = static_cast<int>(base + (t < extra ? 1 : 0));
      const float* at = a + m0 * ars;
      const float* bt = b + n0;
      float* ct = c + m0 * crs + n0;
      float* cm = colmax + n0;
      switch (rows) {
        case 6: ScoreTile<6, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
        case 5: ScoreTile<5, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
        case 4: ScoreTile<4, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
        case 3: ScoreTile<3, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
        case 2: ScoreTile<2, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
        default: ScoreTile<1, KC>(at, ars, bt, bks, K, ct, crs, m0, lo, hi, cm); break;
      }
      m0 += rows;
    }
  }
}

HWY_INLINE void Scores(int64_t M, int64_t ncols, int64_t K, const float* a, int64_t ars,
                       const float* b, int64_t bks, float* c, int64_t crs, const float* lof,
                       const float* hif, float* colmax) {
  switch (K) {
    case 32: return ScoresK<32>(M, ncols, K, a, ars, b, bks, c, crs, lof, hif, colmax);
    case 64: return ScoresK<64>(M, ncols, K, a, ars, b, bks, c, crs, lof, hif, colmax);
    case 128: return ScoresK<128>(M, ncols, K, a, ars, b, bks, c, crs, lof, hif, colmax);
    case 256: return ScoresK<256>(M, ncols, K, a, ars, b, bks, c, crs, lof, hif, colmax);
    default: return ScoresK<0>(M, ncols, K, a, ars, b, bks, c, crs, lof, hif, colmax);
  }
}

// 2^x: x = n + f with n = round(x), |f| <= 1/2, 2^f by a minimax
// polynomial with p(0) = 1 (so exp2(0) is exactly 1), times 2^n.
//  * AVX-512: degree 5 (its own relative error 9e-8; with fp32 rounding at
//    most 1.7e-7, 2.0 ulp, measured on a 1e-5 grid over [-126, 126]), 2^n
//    applied by VSCALEFPS. x is clamped to [-160, 127] first: x <= -150,
//    -inf included, gives exactly 0 (2^-150 rounds to 0); x in (-150, -126)
//    gives the subnormal result.
//  * Other targets: degree 6 (relative error below 8e-8, 1.3 ulp; the
//    polynomial's own 2e-9), 2^n made from its exponent bits. x is clamped
//    to [-127, 127]: x <= -126.5, -inf included, gives exactly 0 (2^n = 0
//    for n = -127). n comes from the float rounding of x + 1.5 * 2^23
//    (+127, the exponent bias): its low bits are n + 127, and shifting them
//    into the exponent field discards the rest.
// kClampHigh = false when x <= 0 is known (the forward's x - max).
// The AVX-512 form: forward +5-11 % at D = 32 (kernels/cpu/README.md).
template <bool kClampHigh = true>
HWY_INLINE VF Exp2(DF d, VF x) {
#if HWY_TARGET == HWY_AVX3
  x = hn::Max(x, hn::Set(d, -160.f));
  if (kClampHigh) x = hn::Min(x, hn::Set(d, 127.f));
  const VF n = hn::Round(x);
  const VF f = hn::Sub(x, n);
  VF p = hn::Set(d, 1.3264727137936999e-03f);
  p = hn::MulAdd(p, f, hn::Set(d, 9.6715127319522455e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5507337442729010e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022242083906267e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314697759807886e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  return VF{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const hn::RebindToSigned<DF> di;
  const VF shifter = hn::Set(d, 12583039.f);  // 1.5 * 2^23 + 127
  x = hn::Max(x, hn::Set(d, -127.f));
  if (kClampHigh) x = hn::Min(x, hn::Set(d, 127.f));
  const VF t = hn::Add(x, shifter);
  const VF f = hn::Sub(x, hn::Sub(t, shifter));
  VF p = hn::Set(d, 1.5353363841541086e-04f);
  p = hn::MulAdd(p, f, hn::Set(d, 1.3398875103738363e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 9.6184373567597082e-03f));
  p = hn::MulAdd(p, f, hn::Set(d, 5.5503324694788310e-02f));
  p = hn::MulAdd(p, f, hn::Set(d, 2.4022647913590250e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 6.9314720285576446e-01f));
  p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
  const VF scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
  return hn::Mul(p, scale);
#endif
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

// Asks for rows [first, first + n) of a [rows, row_stride] fp32 tensor,
// `cols` floats each, to be brought into cache ahead of their use.
void PrefetchRows(const float* base, int64_t first, int64_t n, int64_t row_stride, int cols) {
  const float* p = base + first * row_stride;
  if (row_stride == cols) {  // contiguous: one run of lines
    const char* c = reinterpret_cast<const char*>(p);
    const int64_t bytes = n * cols * int64_t{sizeof(float)};
    for (int64_t b = 0; b < bytes; b += 64) hwy::Prefetch(c + b);
    return;
  }
  for (int64_t r = 0; r < n; ++r, p += row_stride) {
    const char* c = reinterpret_cast<const char*>(p);
    for (int64_t b = 0; b < cols * int64_t{sizeof(float)}; b += 64) hwy::Prefetch(c + b);
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

int PackedRowLengthImpl(int head_dim) {
  const int two_vectors = 2 * static_cast<int>(hn::Lanes(DF()));
  return (head_dim + two_vectors - 1) / two_vectors * two_vectors;
}

// PackRows (tile_kernels.h).
void PackRowsImpl(const void* src, DType dtype, int64_t src_row_stride, int64_t rows, int cols,
                  float scale, float* dst, int64_t dst_row_length) {
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const VF vs = hn::Set(d, scale);
  for (int64_t r = 0; r < rows; ++r) {
    float* out = dst + r * dst_row_length;
    const int64_t first = r * src_row_stride;
    int c = 0;
    switch (dtype) {
      case DType::kFloat32: {
        const float* in = static_cast<const float*>(src) + first;
        for (; c + N <= cols; c += N) hn::StoreU(hn::Mul(hn::LoadU(d, in + c), vs), d, out + c);
        break;
      }
      case DType::kBFloat16: {
        const hn::Rebind<hwy::bfloat16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::bfloat16_t*>(src) + first;
        for (; c + N <= cols; c += N) {
          hn::StoreU(hn::Mul(hn::PromoteTo(d, hn::LoadU(dh, in + c)), vs), d, out + c);
        }
        break;
      }
      case DType::kFloat16: {
        const hn::Rebind<hwy::float16_t, DF> dh;
        const auto* in = reinterpret_cast<const hwy::float16_t*>(src) + first;
        for (; c + N <= cols; c += N) {
          hn::StoreU(hn::Mul(hn::PromoteTo(d, hn::LoadU(dh, in + c)), vs), d, out + c);
        }
        break;
      }
    }
    for (; c < cols; ++c) out[c] = LoadAsFloat(src, dtype, first + c) * scale;
    for (; c < dst_row_length; ++c) out[c] = 0.f;
  }
}

// HasNonFiniteOrHuge (tile_kernels.h): one compare of the exponent field
// per element, a whole row at a time.
bool HasNonFiniteOrHugeImpl(const void* base, DType dtype, int64_t rows, int64_t row_stride,
                            int64_t cols, int max_exp) {
  if (base == nullptr) return false;
  const int biased = std::min(255, 127 + max_exp);
  if (dtype == DType::kFloat32) {
    // Signed compares of the masked field (below 2^31): x >= limit as x > limit - 1.
    const hn::ScalableTag<int32_t> du;
    const int64_t N = static_cast<int64_t>(hn::Lanes(du));
    const uint32_t limit = static_cast<uint32_t>(biased) << 23;
    const auto mask = hn::Set(du, 0x7f800000), lim = hn::Set(du, static_cast<int32_t>(limit) - 1);
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t* p = static_cast<const uint32_t*>(base) + r * row_stride;
      const int32_t* ps = reinterpret_cast<const int32_t*>(p);
      auto bad = hn::Zero(du);
      int64_t c = 0;
      for (; c + N <= cols; c += N) {
        bad = hn::Or(bad, hn::VecFromMask(du, hn::And(hn::LoadU(du, ps + c), mask) > lim));
      }
      if (!hn::AllFalse(du, hn::Ne(bad, hn::Zero(du)))) return true;
      for (; c < cols; ++c) {
        if ((p[c] & 0x7f800000u) >= limit) return true;
      }
    }
    return false;
  }
  // bf16: the fp32 exponent field; fp16: its own, all ones only.
  const bool bf16 = dtype == DType::kBFloat16;
  const uint16_t field = bf16 ? 0x7f80 : 0x7c00;
  const uint16_t limit = bf16 ? static_cast<uint16_t>(biased << 7) : 0x7c00;
  const hn::ScalableTag<int16_t> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const auto mask = hn::Set(du, static_cast<int16_t>(field));
  const auto lim = hn::Set(du, static_cast<int16_t>(limit - 1));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* p = static_cast<const uint16_t*>(base) + r * row_stride;
    const int16_t* ps = reinterpret_cast<const int16_t*>(p);
    auto bad = hn::Zero(du);
    int64_t c = 0;
    for (; c + N <= cols; c += N) {
      bad = hn::Or(bad, hn::VecFromMask(du, hn::And(hn::LoadU(du, ps + c), mask) > lim));
    }
    if (!hn::AllFalse(du, hn::Ne(bad, hn::Zero(du)))) return true;
    for (; c < cols; ++c) {
      if ((p[c] & field) >= limit) return true;
    }
  }
  return false;
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

  // The tile's Q rows lie one token row (every head) apart in the caller's
  // tensor: their cache lines are asked for all at once here, so the misses
  // overlap instead of stalling the transpose below one row at a time (it
  // was a fifth of this function's own time at D = 32, fp32, 8 heads).
  {
    const char* qb = static_cast<const char*>(t.q);
    const int64_t row_bytes = int64_t{D} * DTypeSize(t.dtype);
    const int64_t stride_bytes = t.q_row_stride * DTypeSize(t.dtype);
    for (int i = 0; i < rows; ++i) {
      for (int64_t b = 0; b < row_bytes; b += 64) hwy::Prefetch(qb + i * stride_bytes + b);
    }
  }

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
  float* qt = scratch.Get(2 * static_cast<size_t>(D) * BQ + BK * BQ + 6 * BQ + D);
  float* ot = qt + static_cast<size_t>(D) * BQ;  // O^T [D, QC]
  float* st = ot + static_cast<size_t>(D) * BQ;  // S^T, then P^T [BK, QC]
  float* m = st + BK * BQ;                       // running max (base 2), may be -inf
  float* l = m + BQ;                             // running sum
  float* alpha = l + BQ;                         // rescale factor of this block
  float* lof = alpha + BQ;                       // per-block key bounds as floats
  float* hif = lof + BQ;
  float* bmax = hif + BQ;                        // this block's column max
  float* qrow = bmax + BQ;                       // one converted Q row [D]

  // Q^T [D, QC], pre-scaled into base-2 logits.
  const float c = t.softmax_scale * kLog2e;
  std::fill(qt, qt + static_cast<size_t>(D) * QC, 0.f);
  for (int i = 0; i < rows; ++i) {
    if (t.dtype == DType::kFloat32) {
      const float* q = static_cast<const float*>(t.q) + i * t.q_row_stride;
      for (int dd = 0; dd < D; ++dd) qt[dd * QC + i] = q[dd] * c;
    } else {
      ConvertImpl(t.q, t.dtype, i * t.q_row_stride, D, qrow);
      for (int dd = 0; dd < D; ++dd) qt[dd * QC + i] = qrow[dd] * c;
    }
  }
  std::fill(ot, ot + static_cast<size_t>(D) * QC, 0.f);
  const VF neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  for (int i = 0; i < QC; i += N) {
    hn::Store(neg_inf, d, m + i);
    hn::Store(hn::Zero(d), d, l + i);
  }

  const float* k = static_cast<const float*>(t.k);
  const float* v = static_cast<const float*>(t.v);
  const int64_t krs = t.kv_row_stride;
  for (int64_t kb0 = key_begin; kb0 < key_end; kb0 += BK) {
    const int nk = static_cast<int>(std::min<int64_t>(BK, key_end - kb0));
    const int64_t kb1 = kb0 + nk;
    if (kb1 < key_end) {
      const int64_t next = std::min<int64_t>(BK, key_end - kb1);
      PrefetchRows(k, kb1, next, krs, D);
      PrefetchRows(v, kb1, next, krs, D);
    }
    bool any = false, interior = true;
    for (int i = 0; i < rows; ++i) {
      any |= lo[i] < kb1 && hi[i] > kb0;
      interior &= lo[i] <= kb0 && hi[i] >= kb1;
    }
    if (!any) continue;  // a fully masked block: skipped, not computed
    const float* kb = k + kb0 * krs;
    const float* vb = v + kb0 * krs;

    // S^T = K Q^T (base-2 logits), masked unless the block is interior to
    // every row's range; the block's column max on the way.
    if (!interior) {
      for (int i = 0; i < QC; ++i) {
        lof[i] = static_cast<float>(std::clamp<int64_t>(lo[i] - kb0, -1, BK + 1));
        hif[i] = static_cast<float>(std::clamp<int64_t>(hi[i] - kb0, -1, BK + 1));
      }
    }
    for (int i = 0; i < QC; i += N) hn::Store(neg_inf, d, bmax + i);
    Scores(nk, QC, D, kb, krs, qt, QC, st, QC, interior ? nullptr : lof,
           interior ? nullptr : hif, bmax);

    // Online softmax along each column (query), N queries at a time.
    for (int i = 0; i < QC; i += N) {
      const VF m_old = hn::Load(d, m + i);
      const VF m_new = hn::Max(m_old, hn::Load(d, bmax + i));
      // A column that has seen no key yet keeps m = -inf; subtracting 0
      // instead makes every exp2 below exactly 0 rather than NaN.
      const VF m_safe = hn::IfThenZeroElse(m_new == neg_inf, m_new);
      const VF a = Exp2<false>(d, hn::Sub(m_old, m_safe));
      VF sum = hn::Zero(d);
      for (int j = 0; j < nk; ++j) {
        const VF p = Exp2<false>(d, hn::Sub(hn::Load(d, st + j * QC + i), m_safe));
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

// The backward tile, with the constants folded into packed operands where
// that costs no accuracy (c = softmax_scale * log2(e)):
//   Qs = c Q (packed), S2 = Qs K^T = c S (base-2 logits), P = exp2(S2 - log2(e) LSE);
//   dP = dO V^T, dS = P (dP - Delta);
//   dV = P^T dO;  dK = ln2 dS^T Qs = scale dS^T Q;  dQ = dS (scale K).
// dP - Delta is formed exactly as dO V^T - rowsum(dO O): where a row sees
// one key (O = V) the two cancel exactly, and dS is exactly 0. dK is scaled
// once at the end rather than through dS: folding ln2 into dS rounds dK
// differently, and the multi-rank numerics test compares every split of
// the keys against this one-rank rounding.
bool BackwardTileImpl(const BwdTile& t) {
  constexpr int BQ = kBwdBlockQ, BK = kBwdBlockK;
  const DF d;
  const int N = static_cast<int>(hn::Lanes(d));
  const int D = t.head_dim;
  const int Dp = PackedRowLengthImpl(D);
  const int nk = t.num_keys;
  const int64_t kb0 = t.first_key;

  const int64_t row_begin = t.row_begin, row_end = t.row_end;
  if (row_begin >= row_end) return false;
  const int64_t num_rows = row_end - row_begin;

  thread_local Scratch scratch;
  const size_t kt_size = static_cast<size_t>(D) * BK;
  const size_t k_block = static_cast<size_t>(BK) * Dp;
  float* kt = scratch.Get(2 * kt_size + k_block + 2 * BQ * BK + 2 * BQ + Dp);
  float* vt = kt + kt_size;   // V^T [D, BK]
  float* kr = vt + kt_size;   // scale K [BK, Dp]
  float* p = kr + k_block;    // P [BQ, BK]
  float* ds = p + BQ * BK;      // dP, then dS [BQ, BK]
  float* lse2 = ds + BQ * BK;   // LSE in base 2, +inf where -inf
  float* dlt = lse2 + BQ;       // Delta
  float* tmp = dlt + BQ;        // one converted row [Dp]

  const VF vscale = hn::Set(d, t.softmax_scale);
  // Pack the key block once for every head: K^T and V^T for the score
  // products, scale K rows for dQ. Padding (keys past nk, columns past D) stays 0.
  std::fill(kt, kt + 2 * kt_size + k_block, 0.f);
  std::fill(tmp, tmp + Dp, 0.f);
  // fp32 rows are read in place (memcpy per row: 7 % of an fp32 D = 32 profile).
  const bool in_place = t.dtype == DType::kFloat32;
  for (int j = 0; j < nk; ++j) {
    float* krow = kr + j * Dp;
    const float* ksrc = krow;
    const float* vsrc = tmp;
    if (in_place) {
      ksrc = static_cast<const float*>(t.k) + (kb0 + j) * t.kv_row_stride;
      vsrc = static_cast<const float*>(t.v) + (kb0 + j) * t.kv_row_stride;
      int dd = 0;  // columns D..Dp keep the fill's zeros
      for (; dd + N <= D; dd += N) {
        hn::Store(hn::Mul(hn::LoadU(d, ksrc + dd), vscale), d, krow + dd);
      }
      for (; dd < D; ++dd) krow[dd] = ksrc[dd] * t.softmax_scale;
    } else {
      ConvertImpl(t.k, t.dtype, (kb0 + j) * t.kv_row_stride, D, krow);
      ConvertImpl(t.v, t.dtype, (kb0 + j) * t.kv_row_stride, D, tmp);
    }
    for (int dd = 0; dd < D; ++dd) kt[dd * BK + j] = ksrc[dd];
    if (!in_place) {
      for (int dd = 0; dd < Dp; dd += N) {
        hn::Store(hn::Mul(hn::Load(d, krow + dd), vscale), d, krow + dd);
      }
    }
    for (int dd = 0; dd < D; ++dd) vt[dd * BK + j] = vsrc[dd];
  }

  const float inf = std::numeric_limits<float>::infinity();
  const VF iota = hn::Iota(d, 0.f);
  const VF vln2 = hn::Set(d, kLn2);
  bool first = true;
  for (int h = 0; h < t.heads; ++h) {
    const float* lse = t.lse + h * t.lse_head_stride;
    const float* delta = t.delta + h * t.lse_head_stride;
    for (int64_t qb0 = row_begin; qb0 < row_end; qb0 += BQ) {
      const int rows = static_cast<int>(std::min<int64_t>(BQ, row_end - qb0));
      const int64_t packed_row = h * t.head_stride + (qb0 - row_begin) * Dp;
      const float* qs = t.q + packed_row;
      const float* dor = t.dout + packed_row;
      for (int i = 0; i < rows; ++i) {
        const float x = lse[qb0 + i];
        // A row whose forward saw no key has LSE = -inf and P = 0 throughout.
        lse2[i] = x == -inf ? inf : x * kLog2e;
        dlt[i] = delta[qb0 + i];
      }

      // S2 = Qs K^T; P = exp2(S2 - LSE2), zero outside each row's key range.
      Gemm<kOverwrite>(rows, BK, D, qs, Dp, 1, kt, BK, p, BK);
      for (int i = 0; i < rows; ++i) {
        int64_t lo, hi;
        RowKeyRange(t.type, t.offset, t.window, t.num_k, qb0 + i, &lo, &hi);
        const int a = static_cast<int>(std::clamp<int64_t>(lo - kb0, 0, nk));
        const int b = static_cast<int>(std::clamp<int64_t>(hi - kb0, 0, nk));
        const VF l2 = hn::Set(d, lse2[i]);
        float* prow = p + i * BK;
        if (a == 0 && b == BK) {
          for (int j = 0; j < BK; j += N) {
            hn::Store(Exp2(d, hn::Sub(hn::Load(d, prow + j), l2)), d, prow + j);
          }
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
      // dP = dO V^T; dS = P (dP - Delta).
      Gemm<kOverwrite>(rows, BK, D, dor, Dp, 1, vt, BK, ds, BK);
      for (int i = 0; i < rows; ++i) {
        const VF dl = hn::Set(d, dlt[i]);
        for (int j = 0; j < BK; j += N) {
          const VF pv = hn::Load(d, p + i * BK + j);
          hn::Store(hn::Mul(pv, hn::Sub(hn::Load(d, ds + i * BK + j), dl)), d, ds + i * BK + j);
        }
      }
      // dV (+)= P^T dO; dK (+)= dS^T Qs; dQ = dS (scale K), straight into the outputs.
      if (first) {
        Gemm<kOverwrite>(nk, Dp, rows, p, 1, BK, dor, Dp, t.dv, Dp);
        Gemm<kOverwrite>(nk, Dp, rows, ds, 1, BK, qs, Dp, t.dk, Dp);
        first = false;
      } else {
        Gemm<kAccumulate>(nk, Dp, rows, p, 1, BK, dor, Dp, t.dv, Dp);
        Gemm<kAccumulate>(nk, Dp, rows, ds, 1, BK, qs, Dp, t.dk, Dp);
      }
      float* dq = t.dq + (h * num_rows + (qb0 - row_begin)) * Dp;
      Gemm<kOverwrite>(rows, Dp, nk, ds, BK, 1, kr, Dp, dq, Dp);
    }
  }
  // dK = ln2 dS^T Qs.
  for (int64_t e = 0; e < int64_t{nk} * Dp; e += N) {
    hn::StoreU(hn::Mul(hn::LoadU(d, t.dk + e), vln2), d, t.dk + e);
  }
  return true;
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

// y[i] = Exp2(x[i]) for i < n, n a multiple of the lanes (exp2_test.cc).
void Exp2Impl(const float* x, int64_t n, float* y) {
  const DF d;
  for (int64_t i = 0; i < n; i += hn::Lanes(d)) hn::StoreU(Exp2(d, hn::LoadU(d, x + i)), d, y + i);
}

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
HWY_EXPORT(PackedRowLengthImpl);
HWY_EXPORT(PackRowsImpl);
HWY_EXPORT(HasNonFiniteOrHugeImpl);
HWY_EXPORT(Exp2Impl);

int PackedRowLength(int head_dim) { return HWY_DYNAMIC_DISPATCH(PackedRowLengthImpl)(head_dim); }

void PackRows(const void* src, DType dtype, int64_t src_row_stride, int64_t rows, int cols,
              float scale, float* dst, int64_t dst_row_length) {
  HWY_DYNAMIC_DISPATCH(PackRowsImpl)(src, dtype, src_row_stride, rows, cols, scale, dst,
                                     dst_row_length);
}

bool HasNonFiniteOrHuge(const void* base, DType dtype, int64_t rows, int64_t row_stride,
                        int64_t cols, int max_exp) {
  return HWY_DYNAMIC_DISPATCH(HasNonFiniteOrHugeImpl)(base, dtype, rows, row_stride, cols,
                                                      max_exp);
}

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

void Exp2ForTest(const float* x, int64_t n, float* y) { HWY_DYNAMIC_DISPATCH(Exp2Impl)(x, n, y); }

}  // namespace hsap::kernels::cpu::internal
#endif  // HWY_ONCE

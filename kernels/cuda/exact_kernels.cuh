// The NaN/Inf path of the CUDA attention kernels (docs/numerics.md), the
// twin of kernels/cpu/exact_tiles.cc:
//  * a scan kernel flags the work items whose inputs hold a NaN, an
//    infinity or a magnitude that could overflow the fast kernels' fp32
//    products (2^56 forward, 2^30 backward; backward also an LSE that is
//    NaN or +inf and a Delta that is not finite), one byte per item, in
//    device memory: no host sync;
//  * the fast tile kernels return at once for tiles of flagged items
//    (FwdParams::exact / BwdParams::exact);
//  * the exact kernels, launched after them once per item in item order
//    (each returns at once when its item is not flagged), compute flagged
//    items in float64, one thread per (row, query head), touching only the
//    allowed (q, k) pairs, with the formulas and edge rules of
//    exact_tiles.cc:
//      s_j = scale q.k_j; m = max s_j; p_j = exp(s_j - m); l = sum p_j
//      O = sum p_j v_j / l; LSE = m + log l (saturated at +-FLT_MAX)
//    a NaN or +inf score makes the row's O and LSE NaN; a row whose allowed
//    scores are all -inf, or that sees no key, adds nothing. The forward
//    merges its partial into o_acc / lse_acc with MergeKernel's rule; the
//    backward (p_j = exp(s_j - LSE), dS_j = p_j (dO.v_j - Delta)) adds dQ
//    (one thread per element in the launch) and dK / dV (fp32 atomics).
// Templates on the storage type, so that attention_fwd.cu, attention_bwd.cu
// (nvcc) and the CPU emulation (attention_emulated.cc) compile the same
// source without duplicate symbols.
#ifndef HSAP_KERNELS_CUDA_EXACT_KERNELS_CUH_
#define HSAP_KERNELS_CUDA_EXACT_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/mask.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/mma.cuh"  // the emulation's stand-ins under HSAP_CUDA_EMULATION

namespace hsap::kernels::cuda::kernel {

constexpr int kScanThreads = 256;
constexpr int kExactThreads = 128;
constexpr int kExactMaxBlocks = 1024;  // grid-stride beyond this
constexpr int kExactMaxHeadDim = 256;
// Tensors scanned per item: q, k, v (forward); q, dout, k, v, lse, delta.
constexpr int kScanForwardTensors = 3;
constexpr int kScanBackwardTensors = 6;
// Magnitudes from 2^kMaxExp on run on the exact kernels (as the CPU's).
constexpr int kScanForwardMaxExp = 56;
constexpr int kScanBackwardMaxExp = 30;

// Blocks of an exact launch of `threads` (row, head) threads, capped.
inline int ExactBlocks(int64_t threads) {
  const int64_t blocks = (threads + kExactThreads - 1) / kExactThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kExactMaxBlocks ? kExactMaxBlocks : blocks));
}

// Whether the 16 storage bits of a T are NaN, +-inf or of magnitude
// 2^max_exp or more (fp16 cannot hold such values: only its inf/NaN).
template <typename T>
struct ScanBits;

template <>
struct ScanBits<__nv_bfloat16> {
  static __device__ __forceinline__ bool Bad(uint16_t bits, int max_exp) {
    const int limit = 127 + max_exp < 255 ? 127 + max_exp : 255;
    return (bits & 0x7f80u) >= static_cast<unsigned>(limit << 7);
  }
};

template <>
struct ScanBits<__half> {
  static __device__ __forceinline__ bool Bad(uint16_t bits, int) {
    return (bits & 0x7c00u) == 0x7c00u;
  }
};

// This thread's share of rows [0, rows) x [0, cols) of a T tensor.
template <typename T>
__device__ __forceinline__ bool ShareIsBad(const void* base, int64_t rows, int64_t stride,
                                           int64_t cols, int max_exp) {
  if (base == nullptr) return false;
  const uint16_t* p = static_cast<const uint16_t*>(base);
  for (int64_t i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    if (ScanBits<T>::Bad(p[(i / cols) * stride + i % cols], max_exp)) return true;
  }
  return false;
}

// This thread's share of an fp32 [heads, stride] tensor's first n columns:
// NaN or +inf (and -inf when any_infinity).
__device__ __forceinline__ bool FloatShareIsBad(const float* base, int heads, int64_t stride,
                                                int64_t n, bool any_infinity) {
  if (base == nullptr) return false;
  for (int64_t i = threadIdx.x; i < heads * n; i += blockDim.x) {
    const float x = base[(i / n) * stride + i % n];
    if (x != x || x == INFINITY || (any_infinity && x == -INFINITY)) return true;
  }
  return false;
}

// Grid (items, kScanForwardTensors): block (i, t) scans tensor t of item i
// and sets exact[i] = 1 on a hit. REQUIRES: exact zeroed before.
template <typename T>
__global__ void ScanForwardKernel(const FwdWorkItem* items, int num_heads_q, int num_heads_kv,
                                  int head_dim, uint8_t* exact) {
  const FwdWorkItem& it = items[blockIdx.x];
  if (it.num_q <= 0 || it.num_k <= 0) return;
  const int e = kScanForwardMaxExp;
  const int64_t q_cols = static_cast<int64_t>(num_heads_q) * head_dim;
  const int64_t kv_cols = static_cast<int64_t>(num_heads_kv) * head_dim;
  bool bad;
  switch (blockIdx.y) {
    case 0: bad = ShareIsBad<T>(it.q, it.num_q, it.q_row_stride, q_cols, e); break;
    case 1: bad = ShareIsBad<T>(it.k, it.num_k, it.kv_row_stride, kv_cols, e); break;
    default: bad = ShareIsBad<T>(it.v, it.num_k, it.kv_row_stride, kv_cols, e); break;
  }
  if (bad) exact[blockIdx.x] = 1;  // every writer writes 1: no race on the value
}

// As ScanForwardKernel over (items, kScanBackwardTensors): q, dout, k, v,
// lse (NaN or +inf) and delta (not finite).
template <typename T>
__global__ void ScanBackwardKernel(const BwdWorkItem* items, int num_heads_q, int num_heads_kv,
                                   int head_dim, uint8_t* exact) {
  const BwdWorkItem& it = items[blockIdx.x];
  if (it.num_q <= 0 || it.num_k <= 0) return;
  const int e = kScanBackwardMaxExp;
  const int64_t q_cols = static_cast<int64_t>(num_heads_q) * head_dim;
  const int64_t kv_cols = static_cast<int64_t>(num_heads_kv) * head_dim;
  bool bad;
  switch (blockIdx.y) {
    case 0: bad = ShareIsBad<T>(it.q, it.num_q, it.q_row_stride, q_cols, e); break;
    case 1: bad = ShareIsBad<T>(it.dout, it.num_q, it.q_row_stride, q_cols, e); break;
    case 2: bad = ShareIsBad<T>(it.k, it.num_k, it.kv_row_stride, kv_cols, e); break;
    case 3: bad = ShareIsBad<T>(it.v, it.num_k, it.kv_row_stride, kv_cols, e); break;
    case 4: bad = FloatShareIsBad(it.lse, num_heads_q, it.lse_stride, it.num_q, false); break;
    default: bad = FloatShareIsBad(it.delta, num_heads_q, it.lse_stride, it.num_q, true); break;
  }
  if (bad) exact[blockIdx.x] = 1;
}

// Row `row` of a T tensor at `head`, widened to double.
template <typename T>
__device__ __forceinline__ void LoadRow(const void* base, int64_t row, int64_t stride, int head,
                                        int dim, double* out) {
  const T* p = static_cast<const T*>(base) + row * stride + static_cast<int64_t>(head) * dim;
  for (int d = 0; d < dim; ++d) out[d] = device::ElementTraits<T>::ToFloat(p[d]);
}

template <typename T>
__device__ __forceinline__ double DotRow(const double* a, const void* base, int64_t row,
                                         int64_t stride, int head, int dim) {
  const T* p = static_cast<const T*>(base) + row * stride + static_cast<int64_t>(head) * dim;
  double s = 0;
  for (int d = 0; d < dim; ++d) s += a[d] * device::ElementTraits<T>::ToFloat(p[d]);
  return s;
}

// The fixed arguments of an exact launch; `item` indexes `items`.
struct ExactParams {
  const void* items;      // FwdWorkItem or BwdWorkItem, strides resolved
  const uint8_t* exact;   // the scan's flags
  int item;
  int num_heads_q;
  int num_heads_kv;
  int head_dim;
  double scale;  // softmax_scale
};

// Merges the float64 partial (o, lse_b) of one (row, head) into the
// accumulators, as MergeKernel: a -inf partial adds nothing; a -inf
// accumulator takes the partial; else log-sum-exp weights in double.
__device__ __forceinline__ void MergeExactRow(const double* o, float lse_b, int dim, float* o_acc,
                                              float* lse_acc) {
  if (lse_b == -INFINITY) return;
  const float a = *lse_acc;
  if (a == -INFINITY) {
    for (int d = 0; d < dim; ++d) o_acc[d] = static_cast<float>(o[d]);
    *lse_acc = lse_b;
    return;
  }
  const double m = fmax(static_cast<double>(a), static_cast<double>(lse_b));
  const double ea = exp(a - m), eb = exp(lse_b - m);
  const double wa = ea / (ea + eb), wb = eb / (ea + eb);
  for (int d = 0; d < dim; ++d) {
    o_acc[d] = static_cast<float>(wa * o_acc[d] + wb * static_cast<float>(o[d]));
  }
  *lse_acc = static_cast<float>(m + log(ea + eb));
}

// The float64 forward of flagged item p.item, one thread per (row, head).
template <typename T>
__global__ void ExactForwardKernel(ExactParams p) {
  if (p.exact == nullptr || !p.exact[p.item]) return;
  const FwdWorkItem& it = static_cast<const FwdWorkItem*>(p.items)[p.item];
  const int D = p.head_dim, group = p.num_heads_q / p.num_heads_kv;
  const double inf = static_cast<double>(INFINITY);
  const int64_t n = it.num_q * p.num_heads_q;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n; w += step) {
    const int64_t row = w / p.num_heads_q;
    const int head = static_cast<int>(w % p.num_heads_q), kv_head = head / group;
    int64_t lo, hi;
    RowKeyRange(it.type, it.offset, it.window, it.num_k, row, &lo, &hi);
    if (lo >= hi) continue;  // sees no key: adds nothing
    double q[kExactMaxHeadDim], o[kExactMaxHeadDim];
    LoadRow<T>(it.q, row, it.q_row_stride, head, D, q);
    bool nan = false;
    double m = -inf;
    for (int64_t j = lo; j < hi; ++j) {
      const double s = DotRow<T>(q, it.k, j, it.kv_row_stride, kv_head, D) * p.scale;
      if (s != s) {
        nan = true;
      } else if (s > m) {
        m = s;
      }
    }
    float lse;
    if (nan || m == inf) {
      for (int d = 0; d < D; ++d) o[d] = static_cast<double>(NAN);
      lse = NAN;
    } else if (m == -inf) {
      continue;  // every allowed score is -inf: nothing to add
    } else {
      double l = 0;
      for (int d = 0; d < D; ++d) o[d] = 0;
      for (int64_t j = lo; j < hi; ++j) {
        const double e = exp(DotRow<T>(q, it.k, j, it.kv_row_stride, kv_head, D) * p.scale - m);
        l += e;
        const T* v = static_cast<const T*>(it.v) + j * it.kv_row_stride +
                     static_cast<int64_t>(kv_head) * D;
        for (int d = 0; d < D; ++d) o[d] += e * device::ElementTraits<T>::ToFloat(v[d]);
      }
      for (int d = 0; d < D; ++d) o[d] /= l;
      const double kMax = 3.4028234663852886e38;  // FLT_MAX: an LSE fp32 can hold
      const double x = m + log(l);
      lse = static_cast<float>(x > kMax ? kMax : (x < -kMax ? -kMax : x));
    }
    float* o_acc = it.o_acc + row * p.num_heads_q * D + static_cast<int64_t>(head) * D;
    MergeExactRow(o, lse, D, o_acc, it.lse_acc + head * it.lse_stride + row);
  }
}

// The float64 backward of flagged item p.item, one thread per (row, head):
// dQ of its row (plain adds: one thread per element in this launch), dK/dV
// of the keys it sees (fp32 atomics). Rows with LSE = -inf add nothing.
template <typename T>
__global__ void ExactBackwardKernel(ExactParams p) {
  if (p.exact == nullptr || !p.exact[p.item]) return;
  const BwdWorkItem& it = static_cast<const BwdWorkItem*>(p.items)[p.item];
  const int D = p.head_dim, group = p.num_heads_q / p.num_heads_kv;
  const int64_t n = it.num_q * p.num_heads_q;
  const int64_t kv_acc_stride = static_cast<int64_t>(p.num_heads_kv) * D;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < n; w += step) {
    const int64_t row = w / p.num_heads_q;
    const int head = static_cast<int>(w % p.num_heads_q), kv_head = head / group;
    const double lse = it.lse[head * it.lse_stride + row];
    int64_t lo, hi;
    RowKeyRange(it.type, it.offset, it.window, it.num_k, row, &lo, &hi);
    if (lse == -static_cast<double>(INFINITY) || lo >= hi) continue;
    double q[kExactMaxHeadDim], dout[kExactMaxHeadDim], dq[kExactMaxHeadDim];
    LoadRow<T>(it.q, row, it.q_row_stride, head, D, q);
    LoadRow<T>(it.dout, row, it.q_row_stride, head, D, dout);
    for (int d = 0; d < D; ++d) dq[d] = 0;
    const double delta = it.delta[head * it.lse_stride + row];
    for (int64_t j = lo; j < hi; ++j) {
      const T* k = static_cast<const T*>(it.k) + j * it.kv_row_stride +
                   static_cast<int64_t>(kv_head) * D;
      const double pj = exp(DotRow<T>(q, it.k, j, it.kv_row_stride, kv_head, D) * p.scale - lse);
      const double ds =
          pj * (DotRow<T>(dout, it.v, j, it.kv_row_stride, kv_head, D) - delta) * p.scale;
      float* dk = it.dk_acc + j * kv_acc_stride + static_cast<int64_t>(kv_head) * D;
      float* dv = it.dv_acc + j * kv_acc_stride + static_cast<int64_t>(kv_head) * D;
      for (int d = 0; d < D; ++d) {
        dq[d] += ds * device::ElementTraits<T>::ToFloat(k[d]);
        atomicAdd(dk + d, static_cast<float>(ds * q[d]));
        atomicAdd(dv + d, static_cast<float>(pj * dout[d]));
      }
    }
    float* dq_acc = it.dq_acc + row * p.num_heads_q * D + static_cast<int64_t>(head) * D;
    for (int d = 0; d < D; ++d) dq_acc[d] += static_cast<float>(dq[d]);
  }
}

}  // namespace hsap::kernels::cuda::kernel

#endif  // HSAP_KERNELS_CUDA_EXACT_KERNELS_CUH_

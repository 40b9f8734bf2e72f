// The element-wise kernels of kernels/cuda (delta, merge, cast, pack /
// unpack / unpack-add) and the host helpers that size and plan them. A header
// so that attention_util.cu (nvcc) and the CPU emulation test
// (tests/gpu/kernel_emulation_test.cc, HSAP_CUDA_EMULATION) compile the same
// source.
#ifndef HSAP_KERNELS_CUDA_UTIL_KERNELS_CUH_
#define HSAP_KERNELS_CUDA_UTIL_KERNELS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/mma.cuh"  // the emulation's stand-ins under HSAP_CUDA_EMULATION

namespace hsap::kernels::cuda::kernel {

constexpr int kThreads = 256;

// Enough blocks for a grid-stride loop over n items, capped.
inline int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

__device__ __forceinline__ float Load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return __half2float(static_cast<const __half*>(base)[i]);
  }
}

// One warp per (token, head).
__global__ void DeltaKernel(const void* o, const void* dout, DType dtype, int64_t num_tokens,
                            int num_heads, int head_dim, float* delta, int64_t lse_stride) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t w = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
       w < num_tokens * num_heads; w += warps) {
    const int64_t token = w / num_heads;
    const int head = static_cast<int>(w % num_heads);
    const int64_t base = w * head_dim;
    float sum = 0.f;
    for (int d = lane; d < head_dim; d += 32) sum += Load(o, dtype, base + d) * Load(dout, dtype, base + d);
    for (int s = 16; s > 0; s /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    if (lane == 0) delta[head * lse_stride + token] = sum;
  }
}

// One thread per (row, head); -inf on either side is merged exactly.
__global__ void MergeKernel(int num_heads, int head_dim, int64_t num_rows, float* o_a,
                            float* lse_a, const float* o_b, const float* lse_b,
                            int64_t lse_stride) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < num_rows * num_heads;
       i += stride) {
    const int64_t row = i / num_heads;
    const int head = static_cast<int>(i % num_heads);
    const float a = lse_a[head * lse_stride + row];
    const float b = lse_b[head * lse_stride + row];
    if (b == -INFINITY) continue;  // nothing to add
    float* oa = o_a + i * head_dim;
    const float* ob = o_b + i * head_dim;
    if (a == -INFINITY) {
      for (int d = 0; d < head_dim; ++d) oa[d] = ob[d];
      lse_a[head * lse_stride + row] = b;
      continue;
    }
    const double m = fmax(static_cast<double>(a), static_cast<double>(b));
    const double ea = exp(a - m), eb = exp(b - m);
    const double wa = ea / (ea + eb), wb = eb / (ea + eb);
    for (int d = 0; d < head_dim; ++d) oa[d] = static_cast<float>(wa * oa[d] + wb * ob[d]);
    lse_a[head * lse_stride + row] = static_cast<float>(m + log(ea + eb));
  }
}

__global__ void CastKernel(const float* src, int64_t n, DType dtype, void* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    switch (dtype) {
      case DType::kFloat32: static_cast<float*>(dst)[i] = src[i]; break;
      case DType::kBFloat16:
        static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(src[i]);
        break;
      default: static_cast<__half*>(dst)[i] = __float2half_rn(src[i]); break;
    }
  }
}

// A non-empty token range and where its rows start in the packed buffer.
struct PackedRange {
  int64_t begin;         // first row in the unpacked tensor
  int64_t packed_begin;  // first row in the packed buffer
};

// The range holding packed row `r`: the last with packed_begin <= r.
__device__ __forceinline__ int64_t UnpackedRow(const PackedRange* ranges, int n, int64_t r) {
  int a = 0, b = n - 1;
  while (a < b) {
    const int mid = (a + b + 1) / 2;
    if (ranges[mid].packed_begin <= r) a = mid; else b = mid - 1;
  }
  return ranges[a].begin + (r - ranges[a].packed_begin);
}

// kToPacked: packed[r] = rows[UnpackedRow(r)], else the reverse. Word is the
// copy unit (uint4, uint32_t or uint8_t), words_per_row of them per row.
template <typename Word, bool kToPacked>
__global__ void PackKernel(const PackedRange* ranges, int num_ranges, int64_t total_rows,
                           int64_t words_per_row, const Word* src, Word* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total_rows * words_per_row;
       i += stride) {
    const int64_t packed_row = i / words_per_row;
    const int64_t word = i % words_per_row;
    const int64_t row = UnpackedRow(ranges, num_ranges, packed_row);
    if (kToPacked) {
      dst[i] = src[row * words_per_row + word];
    } else {
      dst[row * words_per_row + word] = src[i];
    }
  }
}

__global__ void UnpackAddKernel(const PackedRange* ranges, int num_ranges, int64_t total_rows,
                                int64_t row_elems, const float* src, float* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total_rows * row_elems;
       i += stride) {
    const int64_t row = UnpackedRow(ranges, num_ranges, i / row_elems);
    atomicAdd(dst + row * row_elems + i % row_elems, src[i]);
  }
}

// Validates `ranges` and lists the non-empty ones with their packed offsets.
inline absl::Status BuildPackedRanges(absl::Span<const TokenRange> ranges,
                               std::vector<PackedRange>* out, int64_t* total_rows) {
  *total_rows = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].begin < 0 || ranges[i].end < ranges[i].begin) {
      return absl::InvalidArgumentError(absl::StrCat("ranges[", i, "]: [", ranges[i].begin, ", ",
                                                     ranges[i].end, ")"));
    }
    if (ranges[i].end == ranges[i].begin) continue;
    out->push_back({ranges[i].begin, *total_rows});
    *total_rows += ranges[i].end - ranges[i].begin;
  }
  return absl::OkStatus();
}

__global__ void FillKernel(float* dst, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = value;
}

// One converting row copy (RowCopy with op kStoreFloat or kAddLoaded) and the
// index of its first element among all elements of the launch.
struct ConvertOp {
  const char* src;
  char* dst;
  int64_t src_stride;
  int64_t dst_stride;
  int64_t elems;  // per row
  int64_t first;  // elements of the ops before this one
  int32_t add;    // 1: dst (fp32) += float(src of dtype); 0: dst (dtype) = src (fp32)
  DType dtype;
};

// Element i of the launch: the op holding it (the last with first <= i),
// then its row and column. Ops write disjoint bytes, so any order is exact.
__global__ void ConvertRowsKernel(const ConvertOp* ops, int num_ops, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    int a = 0, b = num_ops - 1;
    while (a < b) {
      const int mid = (a + b + 1) / 2;
      if (ops[mid].first <= i) a = mid; else b = mid - 1;
    }
    const ConvertOp& op = ops[a];
    const int64_t local = i - op.first, r = local / op.elems, c = local % op.elems;
    const char* src = op.src + r * op.src_stride;
    char* dst = op.dst + r * op.dst_stride;
    if (op.add) {
      reinterpret_cast<float*>(dst)[c] += Load(src, op.dtype, c);
      continue;
    }
    const float x = reinterpret_cast<const float*>(src)[c];
    switch (op.dtype) {
      case DType::kFloat32: reinterpret_cast<float*>(dst)[c] = x; break;
      case DType::kBFloat16: reinterpret_cast<__nv_bfloat16*>(dst)[c] = __float2bfloat16_rn(x); break;
      default: reinterpret_cast<__half*>(dst)[c] = __float2half_rn(x); break;
    }
  }
}

// The converting copies of `copies` as a kernel table (kCopy ones are left
// to cudaMemcpy2DAsync), with the launch's element count.
inline absl::Status BuildConvertOps(absl::Span<const RowCopy> copies, std::vector<ConvertOp>* out,
                                    int64_t* total) {
  *total = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    const RowCopy& c = copies[i];
    if (c.rows < 0 || c.elems < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("copies[", i, "]: rows ", c.rows, ", elems ", c.elems));
    }
    if (c.op == CopyOp::kCopy || c.rows == 0 || c.elems == 0) continue;
    out->push_back({static_cast<const char*>(c.src), static_cast<char*>(c.dst), c.src_stride,
                    c.dst_stride, c.elems, *total, c.op == CopyOp::kAddLoaded ? 1 : 0, c.dtype});
    *total += c.rows * c.elems;
  }
  return absl::OkStatus();
}

}  // namespace hsap::kernels::cuda::kernel

#endif  // HSAP_KERNELS_CUDA_UTIL_KERNELS_CUH_

// CUDA attention kernels: the GPU twin of kernels/cpu/attention.h (DESIGN.md
// §2, §4, §6).
//
// Same work items, same layouts, same numerics contract as the CPU backend;
// only the pointers are device pointers and every call is queued on a CUDA
// stream. Forward items merge their partial (O, LSE) into fp32 accumulators
// with log-sum-exp; backward items add dQ/dK/dV into fp32 accumulators.
//
// Tensor layout (flash-attention varlen): Q/O/dQ/dO: [tokens, Hq, D],
// K/V/dK/dV: [tokens, Hkv, D], LSE: [Hq, tokens] fp32 natural log. GQA: query
// head h reads kv head h / (Hq / Hkv).
//
// Supported: storage bf16 and fp16 (fp32 storage is the CPU backend's job:
// INVALID_ARGUMENT naming `dtype`), head_dim 64, 128 or 256, any Hq % Hkv == 0.
// A query row that sees no key keeps LSE = -inf and O = 0, never NaN.
// NaN/Inf: as a dense float64 softmax over the allowed (q, k) pairs
// (docs/numerics.md): a scan kernel flags the items whose inputs are not
// all finite (or large enough to overflow fp32 products) and those items
// run on float64 exact kernels (exact_kernels.cuh), one launch per item.
//
// Asynchrony: every call returns once its work is queued on `stream`; host
// arrays passed in (`items`, `ranges`) may be freed on return (they are
// copied). Device buffers must stay valid until the stream reaches the work.
// Errors: INVALID_ARGUMENT naming the field for what the kernels do not
// support; FAILED_PRECONDITION with cudaGetErrorString's text for CUDA
// errors, including "built without CUDA" from a build without the toolkit.
//
// Example (one rank, one packed sequence, causal documents):
//   AttentionShape shape{Hq, Hkv, 128, DType::kBFloat16, 1.0f / std::sqrt(128.f)};
//   std::vector<FwdWorkItem> items;   // one per document slice, device pointers
//   HSAP_RETURN_IF_ERROR(Forward(shape, items, stream));
//   HSAP_RETURN_IF_ERROR(CastFromFloat(o_acc, T * Hq * D, shape.dtype, o, stream));
#ifndef HSAP_KERNELS_CUDA_ATTENTION_H_
#define HSAP_KERNELS_CUDA_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/mask.h"
#include "kernels/attention_params.h"

// cudaStream_t without <cuda_runtime.h>, so CPU-only code can hold one.
struct CUstream_st;

namespace hsap::kernels::cuda {

using CudaStream = CUstream_st*;  // == cudaStream_t; nullptr is the legacy default stream

// The kernels' contract (kernels/attention_params.h), shared with the CPU
// backend. Here: storage bf16 or fp16, head_dim 64, 128 or 256; row strides
// must keep every row 16-byte aligned (multiples of 8 elements); all
// pointers are device pointers.
using ::hsap::kernels::AttentionShape;
using ::hsap::kernels::BwdWorkItem;
using ::hsap::kernels::FwdWorkItem;

// Queues `items` on `stream`. Items may merge into the same accumulator rows:
// items whose o_acc row ranges or LSE column ranges overlap run in separate,
// stream-ordered launches (waves), so the result is the serial merge up to
// fp32 rounding. REQUIRES: two items' LSE columns overlap only where their
// o_acc rows do or their head-0 column ranges do (true for the [Hq, tokens]
// convention); every range inside its buffer.
[[nodiscard]] absl::Status Forward(const AttentionShape& shape,
                                   absl::Span<const FwdWorkItem> items, CudaStream stream);

// Queues `items` on `stream`: the scan, one tile launch, one exact launch
// per item (returning at once for unflagged items). Items may share dq/dk/dv rows
// (all updates are fp32 atomic adds, so the sum is the serial sum up to fp32
// rounding, in a nondeterministic order).
[[nodiscard]] absl::Status Backward(const AttentionShape& shape,
                                    absl::Span<const BwdWorkItem> items, CudaStream stream);

// delta[h * lse_stride + t] = sum_d dout[t, h, d] * o[t, h, d] (fp32), for t
// in [0, num_tokens). o, dout: [num_tokens, Hq, D] of shape.dtype (fp32 too).
[[nodiscard]] absl::Status ComputeDelta(const AttentionShape& shape, const void* o,
                                        const void* dout, int64_t num_tokens, float* delta,
                                        int64_t lse_stride, CudaStream stream);

// Merges partial (o_b, lse_b) into (o_a, lse_a), as kernels/cpu MergePartial:
// o: [num_rows, num_heads, head_dim] fp32, lse: [num_heads, lse_stride] fp32.
// Rows with both LSE = -inf stay O = 0, LSE = -inf.
[[nodiscard]] absl::Status MergePartial(int num_heads, int head_dim, int64_t num_rows,
                                        float* o_a, float* lse_a, const float* o_b,
                                        const float* lse_b, int64_t lse_stride,
                                        CudaStream stream);

// Converts n fp32 elements to `dtype` (round to nearest even, as common/dtype.h).
[[nodiscard]] absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst,
                                         CudaStream stream);

// Rows [begin, end) of a row-major tensor ([tokens, H, D]: one row = one token).
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Gathers `ranges` of `src` (rows of `row_bytes` bytes) into `dst`, back to
// back in the order given: dst holds sum(end - begin) rows.
[[nodiscard]] absl::Status Pack(const void* src, int64_t row_bytes,
                                absl::Span<const TokenRange> ranges, void* dst,
                                CudaStream stream);

// The inverse of Pack: scatters the packed rows of `src` back into `ranges` of
// `dst`. REQUIRES: ranges do not overlap.
[[nodiscard]] absl::Status Unpack(const void* src, int64_t row_bytes,
                                  absl::Span<const TokenRange> ranges, void* dst,
                                  CudaStream stream);

// As Unpack for fp32 rows of `row_elems` elements, but adds into dst
// (dst[row] += src[packed row]): returning dK/dV partials to their owner.
// Overlapping ranges are allowed (atomic adds).
[[nodiscard]] absl::Status UnpackAdd(const float* src, int64_t row_elems,
                                     absl::Span<const TokenRange> ranges, float* dst,
                                     CudaStream stream);

// Device memory and streams, for the executor's CUDA backend.
// `bytes` of zero-filled device memory on the current device (nullptr for
// 0); RESOURCE_EXHAUSTED when the device is out of memory.
[[nodiscard]] absl::Status DeviceAllocate(int64_t bytes, void** out);
void DeviceFree(void* p);
// A new non-blocking stream on the current device / its destruction.
[[nodiscard]] absl::Status StreamCreate(CudaStream* out);
void StreamDestroy(CudaStream stream);
// Waits for everything queued on `stream`; the first error it met.
[[nodiscard]] absl::Status StreamSynchronize(CudaStream stream);

// dst[i] = value for i < n (device memory).
[[nodiscard]] absl::Status Fill(float* dst, int64_t n, float value, CudaStream stream);

// The row copies (kernels/attention_params.h), in one stream-ordered batch.
// kCopy rows may move between host and device memory (cudaMemcpy2DAsync);
// kStoreFloat and kAddLoaded run in one kernel over device memory.
// REQUIRES: no two copies write the same bytes (adds into one destination go
// in separate calls, which run in call order).
[[nodiscard]] absl::Status CopyRows(absl::Span<const RowCopy> copies, CudaStream stream);

// Whether this library was built with nvcc (false: every call above answers
// FAILED_PRECONDITION "built without CUDA").
bool BuiltWithCuda();

}  // namespace hsap::kernels::cuda

#endif  // HSAP_KERNELS_CUDA_ATTENTION_H_

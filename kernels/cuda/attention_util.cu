// The element-wise companions of the attention kernels on the GPU:
// ComputeDelta, MergePartial, CastFromFloat, and Pack / Unpack / UnpackAdd
// (the gather and scatter of token ranges around a transfer). The kernels
// are in util_kernels.cuh; this file checks arguments and launches them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/util_kernels.cuh"

namespace hsap::kernels::cuda {
namespace {

using namespace kernel;  // NOLINT: the kernels and their helpers

template <bool kToPacked>
absl::Status PackOrUnpack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                          void* dst, CudaStream stream) {
  if (row_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_bytes: ", row_bytes));
  }
  std::vector<PackedRange> packed;
  int64_t total_rows = 0;
  HSAP_RETURN_IF_ERROR(BuildPackedRanges(ranges, &packed, &total_rows));
  if (total_rows == 0) return absl::OkStatus();
  std::vector<uint8_t> table;
  internal::AppendTable(packed, &table);
  internal::StreamScratch scratch(stream);
  HSAP_RETURN_IF_ERROR(scratch.Upload(table));
  const PackedRange* d_ranges = scratch.At<PackedRange>(0);
  const int n = static_cast<int>(packed.size());
  const uintptr_t align = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                          static_cast<uintptr_t>(row_bytes);
  if (align % 16 == 0) {
    const int64_t words = row_bytes / 16;
    PackKernel<uint4, kToPacked><<<GridFor(total_rows * words), kThreads, 0, stream>>>(
        d_ranges, n, total_rows, words, static_cast<const uint4*>(src), static_cast<uint4*>(dst));
  } else if (align % 4 == 0) {
    const int64_t words = row_bytes / 4;
    PackKernel<uint32_t, kToPacked><<<GridFor(total_rows * words), kThreads, 0, stream>>>(
        d_ranges, n, total_rows, words, static_cast<const uint32_t*>(src),
        static_cast<uint32_t*>(dst));
  } else {
    PackKernel<uint8_t, kToPacked><<<GridFor(total_rows * row_bytes), kThreads, 0, stream>>>(
        d_ranges, n, total_rows, row_bytes, static_cast<const uint8_t*>(src),
        static_cast<uint8_t*>(dst));
  }
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::Status ComputeDelta(const AttentionShape& shape, const void* o, const void* dout,
                          int64_t num_tokens, float* delta, int64_t lse_stride,
                          CudaStream stream) {
  if (shape.num_heads_q <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads_q/head_dim: ", shape.num_heads_q,
                                                   "/", shape.head_dim));
  }
  if (num_tokens <= 0) return absl::OkStatus();
  const int64_t warps = num_tokens * shape.num_heads_q;
  DeltaKernel<<<GridFor(warps * 32), kThreads, 0, stream>>>(
      o, dout, shape.dtype, num_tokens, shape.num_heads_q, shape.head_dim, delta, lse_stride);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status MergePartial(int num_heads, int head_dim, int64_t num_rows, float* o_a,
                          float* lse_a, const float* o_b, const float* lse_b, int64_t lse_stride,
                          CudaStream stream) {
  if (num_rows <= 0 || num_heads <= 0) return absl::OkStatus();
  MergeKernel<<<GridFor(num_rows * num_heads), kThreads, 0, stream>>>(
      num_heads, head_dim, num_rows, o_a, lse_a, o_b, lse_b, lse_stride);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst,
                           CudaStream stream) {
  if (n <= 0) return absl::OkStatus();
  CastKernel<<<GridFor(n), kThreads, 0, stream>>>(src, n, dtype, dst);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status Pack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                  void* dst, CudaStream stream) {
  return PackOrUnpack<true>(src, row_bytes, ranges, dst, stream);
}

absl::Status Unpack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                    void* dst, CudaStream stream) {
  return PackOrUnpack<false>(src, row_bytes, ranges, dst, stream);
}

absl::Status UnpackAdd(const float* src, int64_t row_elems, absl::Span<const TokenRange> ranges,
                       float* dst, CudaStream stream) {
  if (row_elems <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_elems: ", row_elems));
  }
  std::vector<PackedRange> packed;
  int64_t total_rows = 0;
  HSAP_RETURN_IF_ERROR(BuildPackedRanges(ranges, &packed, &total_rows));
  if (total_rows == 0) return absl::OkStatus();
  std::vector<uint8_t> table;
  internal::AppendTable(packed, &table);
  internal::StreamScratch scratch(stream);
  HSAP_RETURN_IF_ERROR(scratch.Upload(table));
  UnpackAddKernel<<<GridFor(total_rows * row_elems), kThreads, 0, stream>>>(
      scratch.At<PackedRange>(0), static_cast<int>(packed.size()), total_rows, row_elems, src,
      dst);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status DeviceAllocate(int64_t bytes, void** out) {
  *out = nullptr;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes));
  if (bytes == 0) return absl::OkStatus();
  const cudaError_t e = cudaMalloc(out, static_cast<size_t>(bytes));
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes: ", cudaGetErrorString(e)));
  }
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(e);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaMemset(*out, 0, static_cast<size_t>(bytes)));
  return absl::OkStatus();
}

void DeviceFree(void* p) {
  if (p != nullptr) cudaFree(p);
}

absl::Status StreamCreate(CudaStream* out) {
  cudaStream_t s = nullptr;
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *out = s;
  return absl::OkStatus();
}

void StreamDestroy(CudaStream stream) {
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status StreamSynchronize(CudaStream stream) {
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status Fill(float* dst, int64_t n, float value, CudaStream stream) {
  if (n <= 0) return absl::OkStatus();
  FillKernel<<<GridFor(n), kThreads, 0, stream>>>(dst, n, value);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status CopyRows(absl::Span<const RowCopy> copies, CudaStream stream) {
  std::vector<ConvertOp> ops;
  int64_t total = 0;
  HSAP_RETURN_IF_ERROR(BuildConvertOps(copies, &ops, &total));
  for (const RowCopy& c : copies) {
    if (c.op != CopyOp::kCopy || c.rows == 0 || c.elems == 0) continue;
    HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        c.dst, static_cast<size_t>(c.rows == 1 ? c.elems : c.dst_stride), c.src,
        static_cast<size_t>(c.rows == 1 ? c.elems : c.src_stride), static_cast<size_t>(c.elems),
        static_cast<size_t>(c.rows), cudaMemcpyDefault, stream));
  }
  if (total == 0) return absl::OkStatus();
  std::vector<uint8_t> table;
  internal::AppendTable(ops, &table);
  internal::StreamScratch scratch(stream);
  HSAP_RETURN_IF_ERROR(scratch.Upload(table));
  ConvertRowsKernel<<<GridFor(total), kThreads, 0, stream>>>(
      scratch.At<ConvertOp>(0), static_cast<int>(ops.size()), total);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace hsap::kernels::cuda

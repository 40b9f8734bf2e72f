// Host helpers shared by the .cu files of kernels/cuda (internal): CUDA
// errors as Status, argument checks common to the entry points, and a
// stream-ordered scratch buffer for the tables a launch reads.
#ifndef HSAP_KERNELS_CUDA_LAUNCH_UTIL_H_
#define HSAP_KERNELS_CUDA_LAUNCH_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"

// Evaluates `expr` (a cudaError_t); unless cudaSuccess, returns
// FAILED_PRECONDITION naming the expression, cudaGetErrorString and file:line.
#define HSAP_KERNEL_CUDA_RETURN_IF_ERROR(expr)                                            \
  do {                                                                                    \
    const cudaError_t hsap_kernel_cuda_error_ = (expr);                                   \
    if (hsap_kernel_cuda_error_ != cudaSuccess) {                                         \
      return ::absl::FailedPreconditionError(::absl::StrCat(                              \
          #expr ": ", cudaGetErrorString(hsap_kernel_cuda_error_), " at ", __FILE__, ":", \
          __LINE__));                                                                     \
    }                                                                                     \
  } while (0)

namespace hsap::kernels::cuda::internal {

// dtype bf16/fp16 and head_dim 64/128/256, heads positive with Hq % Hkv == 0.
inline absl::Status ValidateShape(const AttentionShape& s) {
  if (s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: ", DTypeName(s.dtype),
        " is not supported by the CUDA kernels (bfloat16, float16; fp32 runs on the CPU)"));
  }
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim: ", s.head_dim, " is not supported by the CUDA kernels (64, 128, 256)"));
  }
  if (s.num_heads_q <= 0 || s.num_heads_kv <= 0 || s.num_heads_q % s.num_heads_kv != 0 ||
      s.num_heads_q > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads_q/num_heads_kv: ", s.num_heads_q,
                                                   "/", s.num_heads_kv,
                                                   " (need 0 < Hkv, Hq % Hkv == 0, Hq <= 65535)"));
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT naming items[i].field when `p` is not 16-byte aligned.
inline absl::Status CheckAligned(const void* p, size_t i, const char* field) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", i, "].", field, ": device pointer not 16-byte aligned"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckStride(int64_t stride, int64_t min, size_t i, const char* field) {
  if (stride % 8 != 0 || stride < min) {
    return absl::InvalidArgumentError(absl::StrCat("items[", i, "].", field, ": ", stride,
                                                   " (need a multiple of 8, >= ", min, ")"));
  }
  return absl::OkStatus();
}

// Bytes of host data copied to one stream-ordered device allocation
// (cudaMallocAsync), freed after the launches queued behind it
// (cudaFreeAsync). The host bytes may be reused as soon as Upload returns.
class StreamScratch {
 public:
  explicit StreamScratch(cudaStream_t stream) : stream_(stream) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (device_ != nullptr) cudaFreeAsync(device_, stream_);
  }

  // Copies `bytes` (a concatenation of the tables) to the device.
  absl::Status Upload(const std::vector<uint8_t>& bytes) {
    if (bytes.empty()) return absl::OkStatus();
    HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&device_, bytes.size(), stream_));
    HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_, bytes.data(), bytes.size(),
                                                     cudaMemcpyHostToDevice, stream_));
    return absl::OkStatus();
  }
  // The device address of byte `offset` of the uploaded data.
  template <typename T>
  const T* At(size_t offset) const {
    return reinterpret_cast<const T*>(static_cast<const uint8_t*>(device_) + offset);
  }

 private:
  cudaStream_t stream_;
  void* device_ = nullptr;
};

// Appends the bytes of `v` to `out`, 16-byte aligned; returns their offset.
template <typename T>
size_t AppendTable(const std::vector<T>& v, std::vector<uint8_t>* out) {
  const size_t offset = (out->size() + 15) / 16 * 16;
  out->resize(offset + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out->data() + offset, v.data(), v.size() * sizeof(T));
  return offset;
}

}  // namespace hsap::kernels::cuda::internal

#endif  // HSAP_KERNELS_CUDA_LAUNCH_UTIL_H_

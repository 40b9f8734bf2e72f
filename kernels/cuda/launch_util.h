// Host helpers shared by the .cu files of kernels/cuda (internal): CUDA
// errors as Status and a stream-ordered scratch buffer for the tables a
// launch reads. (Argument checks and launch plans: launch_plan.h.)
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
#include "kernels/cuda/launch_plan.h"

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
  // The same, writable by kernels (e.g. the scan's flags, uploaded as zeros).
  template <typename T>
  T* MutableAt(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(device_) + offset);
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

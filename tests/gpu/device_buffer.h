// Test-only device memory for tests/gpu: a move-only cudaMalloc owner with
// host copies, and a check that a GPU is visible. (server/gpu has the
// production RAII types; the kernels' tests stay independent of the daemon.)
#ifndef HSAP_TESTS_GPU_DEVICE_BUFFER_H_
#define HSAP_TESTS_GPU_DEVICE_BUFFER_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace hsap::gpu_test {

// Aborts the test binary with the CUDA error text: a failed allocation or
// copy in a test is an environment failure, not a kernel result.
inline void CudaOrDie(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

// Empty string when a GPU is visible, else why not.
inline std::string NoGpuReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  if (count == 0) return "no GPU visible";
  return "";
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) CudaOrDie(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  // A buffer holding a copy of `bytes` host bytes at `src`.
  static DeviceBuffer From(const void* src, size_t bytes) {
    DeviceBuffer b(bytes);
    if (bytes > 0) CudaOrDie(cudaMemcpy(b.ptr_, src, bytes, cudaMemcpyHostToDevice), "upload");
    return b;
  }
  template <typename T>
  static DeviceBuffer FromVector(const std::vector<T>& v) {
    return From(v.data(), v.size() * sizeof(T));
  }

  template <typename T>
  std::vector<T> ToHost() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (bytes_ > 0) {
      CudaOrDie(cudaMemcpy(out.data(), ptr_, out.size() * sizeof(T), cudaMemcpyDeviceToHost),
                "download");
    }
    return out;
  }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace hsap::gpu_test

#endif  // HSAP_TESTS_GPU_DEVICE_BUFFER_H_

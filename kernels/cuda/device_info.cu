#include <cuda_runtime.h>

#include "kernels/cuda/device_info.h"

namespace hsap::cuda {
namespace {

// One macro per runtime library: a CUDA error becomes a Status with file:line.
#define HSAP_CUDA_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                \
    const cudaError_t hsap_cuda_err_ = (expr);                                        \
    if (hsap_cuda_err_ != cudaSuccess) {                                              \
      return absl::FailedPreconditionError(std::string(#expr " failed at " __FILE__ ":") + \
                                           std::to_string(__LINE__) + ": " +          \
                                           cudaGetErrorString(hsap_cuda_err_));       \
    }                                                                                 \
  } while (0)

__global__ void FillKernel(float* out, int n, float scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(i) * scale;
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  HSAP_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  std::vector<DeviceInfo> out;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    HSAP_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, d));
    out.push_back({d, prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  if (out.empty()) return absl::FailedPreconditionError("the CUDA runtime sees no GPU");
  return out;
}

absl::StatusOr<std::vector<float>> SmokeTest(int device, int n, float scale) {
  HSAP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  float* d = nullptr;
  HSAP_CUDA_RETURN_IF_ERROR(cudaMalloc(&d, sizeof(float) * n));
  FillKernel<<<(n + 255) / 256, 256>>>(d, n, scale);
  std::vector<float> host(n);
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t copy = cudaMemcpy(host.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost);
  cudaFree(d);
  HSAP_CUDA_RETURN_IF_ERROR(launch);
  HSAP_CUDA_RETURN_IF_ERROR(copy);
  return host;
}

}  // namespace hsap::cuda

#include "server/gpu/cuda_stream.h"

#include <utility>

#include "server/gpu/cuda_device.h"
#include "server/gpu/gpu_status.h"

namespace hsap::gpu {

absl::StatusOr<CudaStream> CudaStream::Create(int device, unsigned int flags) {
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device);
  if (!on.ok()) return on.status();
  cudaStream_t stream = nullptr;
  HSAP_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, flags));
  return CudaStream(stream, device);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(std::exchange(other.device_, -1)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaStream::~CudaStream() { Reset(); }

void CudaStream::Reset() {
  if (stream_ == nullptr) return;
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  cudaStreamDestroy(stream_);  // best effort: a destructor cannot report
  stream_ = nullptr;
  device_ = -1;
}

absl::Status CudaStream::Synchronize() const {
  if (stream_ == nullptr) return absl::FailedPreconditionError("CudaStream is empty");
  HSAP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace hsap::gpu

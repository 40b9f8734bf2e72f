#include "server/gpu/cuda_event.h"

#include <utility>

#include "server/gpu/cuda_device.h"
#include "server/gpu/gpu_status.h"

namespace hsap::gpu {

absl::StatusOr<CudaEvent> CudaEvent::Create(int device, unsigned int flags) {
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device);
  if (!on.ok()) return on.status();
  cudaEvent_t event = nullptr;
  HSAP_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, flags));
  return CudaEvent(event, device);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(std::exchange(other.device_, -1)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = std::exchange(other.device_, -1);
  }
  return *this;
}

CudaEvent::~CudaEvent() { Reset(); }

void CudaEvent::Reset() {
  if (event_ == nullptr) return;
  absl::StatusOr<ScopedDevice> on = ScopedDevice::Enter(device_);
  cudaEventDestroy(event_);  // best effort: a destructor cannot report
  event_ = nullptr;
  device_ = -1;
}

absl::Status CudaEvent::Record(cudaStream_t stream) {
  if (event_ == nullptr) return absl::FailedPreconditionError("CudaEvent is empty");
  HSAP_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, stream));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaEvent::Query() const {
  if (event_ == nullptr) return absl::FailedPreconditionError("CudaEvent is empty");
  const cudaError_t error = cudaEventQuery(event_);
  if (error == cudaSuccess) return true;
  if (error == cudaErrorNotReady) return false;
  return HSAP_CUDA_STATUS(error, "cudaEventQuery");
}

}  // namespace hsap::gpu

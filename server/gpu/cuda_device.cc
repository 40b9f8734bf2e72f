#include "server/gpu/cuda_device.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/gpu/gpu_status.h"

namespace hsap::gpu {

absl::StatusOr<int> VisibleDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    absl::Status status = HSAP_CUDA_STATUS(error, "cudaGetDeviceCount");
    // Whatever stops the runtime from counting devices means "no usable GPU
    // here", which is the machine's state, not the caller's mistake.
    return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", status.message()));
  }
  if (count <= 0) return absl::FailedPreconditionError("no usable GPU: the CUDA runtime sees 0 devices");
  return count;
}

absl::Status CheckDevice(int device) {
  absl::StatusOr<int> count = VisibleDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " is not visible: ", *count, " GPU(s), 0..", *count - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScopedDevice> ScopedDevice::Enter(int device) {
  absl::Status checked = CheckDevice(device);
  if (!checked.ok()) return checked;
  int previous = 0;
  HSAP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  if (previous != device) HSAP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return ScopedDevice(previous);
}

ScopedDevice::ScopedDevice(ScopedDevice&& other) noexcept
    : previous_(std::exchange(other.previous_, -1)) {}

ScopedDevice::~ScopedDevice() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // best effort: a destructor cannot report
}

}  // namespace hsap::gpu

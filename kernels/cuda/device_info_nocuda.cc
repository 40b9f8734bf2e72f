// CPU fallback of device_info.h for builds without the CUDA toolkit.
#include "kernels/cuda/device_info.h"

namespace hsap::cuda {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<DeviceInfo>> ListDevices() {
  return absl::FailedPreconditionError("hsap was built without the CUDA toolkit");
}

absl::StatusOr<std::vector<float>> SmokeTest(int, int, float) {
  return absl::FailedPreconditionError("hsap was built without the CUDA toolkit");
}

}  // namespace hsap::cuda

// Which GPUs this process sees, and a scoped switch of the calling thread's
// current device (the CUDA runtime's current device is per thread; every
// wrapper here makes its own device current around the calls it makes).
//
//   HSAP_ASSIGN_OR_RETURN(int count, VisibleDeviceCount());
//   HSAP_RETURN_IF_ERROR(CheckDevice(device));
//   HSAP_ASSIGN_OR_RETURN(ScopedDevice on, ScopedDevice::Enter(device));
#ifndef HSAP_SERVER_GPU_CUDA_DEVICE_H_
#define HSAP_SERVER_GPU_CUDA_DEVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsap::gpu {

// The number of visible GPUs, >= 1. FAILED_PRECONDITION when there is no
// driver, no device or the driver is too old (the message says which) —
// never a crash on a machine without a GPU.
absl::StatusOr<int> VisibleDeviceCount();

// OK when `device` names a visible GPU; FAILED_PRECONDITION as
// VisibleDeviceCount; INVALID_ARGUMENT naming the device and the count when
// it is out of range.
absl::Status CheckDevice(int device);

// Makes `device` current for the calling thread and restores the previous
// current device on destruction. Move-only.
class ScopedDevice {
 public:
  // INVALID_ARGUMENT / FAILED_PRECONDITION as CheckDevice.
  static absl::StatusOr<ScopedDevice> Enter(int device);

  ScopedDevice(ScopedDevice&& other) noexcept;
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();

 private:
  explicit ScopedDevice(int previous) : previous_(previous) {}
  int previous_ = -1;  // -1: nothing to restore (moved from)
};

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_CUDA_DEVICE_H_

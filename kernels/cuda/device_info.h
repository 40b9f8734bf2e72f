// What the CUDA runtime sees on this machine. Built by nvcc when the toolkit
// is present (tools/cuda_rules.bzl), from a CPU fallback otherwise; either
// way the answer is a Status, never a crash: a machine without a GPU gets
// FAILED_PRECONDITION naming the reason.
#ifndef HSAP_KERNELS_CUDA_DEVICE_INFO_H_
#define HSAP_KERNELS_CUDA_DEVICE_INFO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hsap::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t memory_bytes = 0;
};

// Whether this binary was built with nvcc.
bool BuiltWithCuda();

// The visible GPUs. FAILED_PRECONDITION when CUDA is absent or sees none.
absl::StatusOr<std::vector<DeviceInfo>> ListDevices();

// Runs a tiny kernel on `device`: fills n floats with their index times
// `scale` and copies them back (a smoke test of launch and copies).
absl::StatusOr<std::vector<float>> SmokeTest(int device, int n, float scale);

}  // namespace hsap::cuda

#endif  // HSAP_KERNELS_CUDA_DEVICE_INFO_H_

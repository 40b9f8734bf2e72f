#include "kernels/cuda/device_info.h"

#include "gtest/gtest.h"

namespace hsap::cuda {
namespace {

// Runs everywhere: without a GPU (or without CUDA) the answer is a clear
// FAILED_PRECONDITION, never a crash.
TEST(DeviceInfoTest, AnswersWithAStatus) {
  auto devices = ListDevices();
  if (!devices.ok()) {
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition) << devices.status();
    EXPECT_FALSE(devices.status().message().empty());
  } else {
    EXPECT_FALSE(devices->empty());
  }
}

}  // namespace
}  // namespace hsap::cuda

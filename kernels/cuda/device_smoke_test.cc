// Tagged "gpu": needs a visible GPU.
#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"

namespace hsap::cuda {
namespace {

TEST(DeviceSmokeTest, KernelLaunchAndCopy) {
  ASSERT_TRUE(BuiltWithCuda());
  auto devices = ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  auto out = SmokeTest(0, 1000, 0.5f);
  ASSERT_TRUE(out.ok()) << out.status();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ((*out)[i], 0.5f * i);
}

}  // namespace
}  // namespace hsap::cuda

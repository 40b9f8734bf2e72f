// The CUDA attention entry points' argument checks, which run before any
// CUDA call and so are testable without a GPU; a build without the toolkit
// answers FAILED_PRECONDITION "built without CUDA" instead.
#include "kernels/cuda/attention.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsap::kernels::cuda {
namespace {

using ::testing::HasSubstr;

AttentionShape Shape(DType dtype, int head_dim) {
  return AttentionShape{4, 2, head_dim, dtype, 0.125f};
}

void ExpectRejected(const absl::Status& status, absl::string_view field) {
  if (!BuiltWithCuda()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("built without CUDA"));
    return;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(std::string(field)));
}

TEST(AttentionApiTest, UnsupportedDtypeAndHeadDimAreNamed) {
  const std::vector<FwdWorkItem> fwd(1);
  const std::vector<BwdWorkItem> bwd(1);
  ExpectRejected(Forward(Shape(DType::kFloat32, 128), fwd, nullptr), "dtype: float32");
  ExpectRejected(Backward(Shape(DType::kFloat32, 64), bwd, nullptr), "dtype: float32");
  ExpectRejected(Forward(Shape(DType::kBFloat16, 96), fwd, nullptr), "head_dim: 96");
  ExpectRejected(Backward(Shape(DType::kFloat16, 32), bwd, nullptr), "head_dim: 32");
  ExpectRejected(Forward(AttentionShape{6, 4, 64, DType::kBFloat16, 0.1f}, fwd, nullptr),
                 "num_heads_q/num_heads_kv: 6/4");
}

TEST(AttentionApiTest, MisalignedPointersAndStridesAreNamed) {
  alignas(16) static char buffer[64];
  FwdWorkItem item;
  item.q = buffer + 2;  // not 16-byte aligned
  item.k = item.v = buffer;
  item.o_acc = reinterpret_cast<float*>(buffer);
  item.lse_acc = reinterpret_cast<float*>(buffer);
  item.num_q = item.num_k = 1;
  item.lse_stride = 1;
  ExpectRejected(Forward(Shape(DType::kBFloat16, 64), {item}, nullptr), "items[0].q:");
  item.q = buffer;
  item.kv_row_stride = 130;  // not a multiple of 8
  ExpectRejected(Forward(Shape(DType::kBFloat16, 64), {item}, nullptr), "items[0].kv_row_stride");
}

TEST(AttentionApiTest, BadRangesAreNamed) {
  const std::vector<TokenRange> ranges = {{0, 4}, {7, 5}};
  ExpectRejected(Pack(nullptr, 256, ranges, nullptr, nullptr), "ranges[1]: [7, 5)");
  ExpectRejected(UnpackAdd(nullptr, 0, ranges, nullptr, nullptr), "row_elems: 0");
}

// Work that computes nothing queues nothing and touches no device.
TEST(AttentionApiTest, EmptyWorkIsOkWithoutADevice) {
  if (!BuiltWithCuda()) GTEST_SKIP() << "built without CUDA";
  FwdWorkItem empty_fwd;  // num_q = num_k = 0
  BwdWorkItem empty_bwd;
  EXPECT_TRUE(Forward(Shape(DType::kBFloat16, 128), {empty_fwd}, nullptr).ok());
  EXPECT_TRUE(Backward(Shape(DType::kFloat16, 256), {empty_bwd}, nullptr).ok());
  EXPECT_TRUE(Pack(nullptr, 256, {{3, 3}}, nullptr, nullptr).ok());
  EXPECT_TRUE(CastFromFloat(nullptr, 0, DType::kBFloat16, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace hsap::kernels::cuda

// Tests of server/gpu that need no GPU: the wrappers are move-only, CUDA and
// NCCL results map to the documented codes with file:line, arguments are
// checked before any device is touched, and a machine without a GPU gets
// FAILED_PRECONDITION (never a crash). On a machine with a GPU the
// no-GPU expectations are skipped (gpu_device_test covers that case).
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/gpu/cuda_device.h"
#include "server/gpu/cuda_event.h"
#include "server/gpu/cuda_stream.h"
#include "server/gpu/device_buffer.h"
#include "server/gpu/gpu_status.h"
#include "server/gpu/nccl_comm.h"
#include "server/gpu/poll_backoff.h"

namespace hsap::gpu {
namespace {

using ::testing::HasSubstr;

template <typename T>
constexpr bool kMoveOnly = !std::is_copy_constructible_v<T> && !std::is_copy_assignable_v<T> &&
                           std::is_nothrow_move_constructible_v<T>;

static_assert(kMoveOnly<CudaStream> && std::is_nothrow_move_assignable_v<CudaStream>);
static_assert(kMoveOnly<CudaEvent> && std::is_nothrow_move_assignable_v<CudaEvent>);
static_assert(kMoveOnly<DeviceBuffer> && std::is_nothrow_move_assignable_v<DeviceBuffer>);
static_assert(kMoveOnly<NcclComm> && std::is_nothrow_move_assignable_v<NcclComm>);
static_assert(kMoveOnly<ScopedDevice> && !std::is_move_assignable_v<ScopedDevice>);

bool HaveGpu() { return VisibleDeviceCount().ok(); }

absl::Status FailCuda(cudaError_t e) {
  HSAP_CUDA_RETURN_IF_ERROR(e);
  return absl::OkStatus();
}
absl::Status FailNccl(ncclResult_t r) {
  HSAP_NCCL_RETURN_IF_ERROR(r);
  return absl::OkStatus();
}
absl::Status FailNcclUnlessInProgress(ncclResult_t r) {
  HSAP_NCCL_RETURN_IF_FAILED(r);
  return absl::OkStatus();
}

TEST(GpuStatusTest, CudaCodesAndMessage) {
  EXPECT_TRUE(FailCuda(cudaSuccess).ok());
  const absl::Status oom = FailCuda(cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("cudaErrorMemoryAllocation 2"));
  EXPECT_THAT(oom.message(), HasSubstr("server/gpu/gpu_test.cc:"));
  EXPECT_THAT(oom.message(), HasSubstr("e: "));  // the expression, then CUDA's text
  EXPECT_EQ(FailCuda(cudaErrorNoDevice).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FailCuda(cudaErrorInsufficientDriver).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FailCuda(cudaErrorInvalidDevice).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FailCuda(cudaErrorNotReady).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FailCuda(cudaErrorIllegalAddress).code(), absl::StatusCode::kInternal);
}

TEST(GpuStatusTest, NcclCodesAndMessage) {
  EXPECT_TRUE(FailNccl(ncclSuccess).ok());
  const absl::Status usage = FailNccl(ncclInvalidUsage);
  EXPECT_EQ(usage.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(usage.message(), HasSubstr("(NCCL 5)"));
  EXPECT_THAT(usage.message(), HasSubstr("server/gpu/gpu_test.cc:"));
  EXPECT_EQ(FailNccl(ncclInvalidArgument).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FailNccl(ncclRemoteError).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FailNccl(ncclSystemError).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FailNccl(ncclInternalError).code(), absl::StatusCode::kInternal);
  // The strict macro rejects "in progress"; the non-blocking one lets it by.
  EXPECT_EQ(FailNccl(ncclInProgress).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(FailNcclUnlessInProgress(ncclInProgress).ok());
  EXPECT_EQ(FailNcclUnlessInProgress(ncclRemoteError).code(), absl::StatusCode::kUnavailable);
}

TEST(GpuHandlesTest, EmptyHandlesAreSafe) {
  CudaStream stream;
  CudaEvent event;
  DeviceBuffer buffer;
  NcclComm comm;
  EXPECT_FALSE(stream.valid());
  EXPECT_FALSE(event.valid());
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_FALSE(comm.valid());
  EXPECT_EQ(stream.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(event.Query().status().code(), absl::StatusCode::kFailedPrecondition);
  CudaStream moved = std::move(stream);
  EXPECT_FALSE(moved.valid());
  comm.Abort();  // no-op on an empty communicator
}

TEST(GpuHandlesTest, ArgumentsCheckedBeforeTheDevice) {
  EXPECT_EQ(DeviceBuffer::Allocate(0, -1).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  auto short_id = NcclComm::InitRank(std::string(7, 'x'), 2, 0, 0, deadline);
  EXPECT_EQ(short_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_id.status().message(), HasSubstr("7 bytes, expected 128"));
  const std::string id(128, '\0');
  EXPECT_EQ(NcclComm::InitRank(id, 0, 0, 0, deadline).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad_rank = NcclComm::InitRank(id, 2, 2, 0, deadline);
  EXPECT_EQ(bad_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("rank 2 is outside [0, 2)"));
}

TEST(GpuHandlesTest, NoGpuIsFailedPrecondition) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is visible; gpu_device_test covers this machine";
  const absl::Status count = VisibleDeviceCount().status();
  EXPECT_EQ(count.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(count.message(), HasSubstr("no usable GPU"));
  EXPECT_EQ(CheckDevice(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStream::Create(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaEvent::Create(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DeviceBuffer::Allocate(0, 64).status().code(), absl::StatusCode::kFailedPrecondition);
  auto comm = NcclComm::InitRank(std::string(128, '\0'), 1, 0, 0, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PollBackoffTest, NeverSleepsPastTheDeadline) {
  PollBackoff backoff(absl::Milliseconds(200), absl::Seconds(10));
  const absl::Time start = absl::Now();
  backoff.Sleep(start + absl::Milliseconds(20));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150));
  const absl::Time past = absl::Now() - absl::Seconds(1);
  const absl::Time before = absl::Now();
  backoff.Sleep(past);
  EXPECT_LT(absl::Now() - before, absl::Milliseconds(50));
}

}  // namespace
}  // namespace hsap::gpu

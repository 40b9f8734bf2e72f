// Tagged "gpu": the wrappers against a real device (at least one visible
// GPU): copies through a stream and an event, moves, out-of-memory, and
// one-rank NCCL communicators (non-blocking init, splits, abort), plus a
// two-rank init whose second rank never comes (DEADLINE_EXCEEDED, bounded).
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

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

TEST(GpuDeviceTest, DevicesAreVisibleAndChecked) {
  absl::StatusOr<int> count = VisibleDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_GE(*count, 1);
  EXPECT_TRUE(CheckDevice(0).ok());
  const absl::Status out = CheckDevice(*count);
  EXPECT_EQ(out.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.message(), HasSubstr("is not visible"));
}

TEST(GpuDeviceTest, StreamEventBufferRoundTrip) {
  const int64_t bytes = (1 << 20) + 3;
  std::vector<unsigned char> host(bytes), back(bytes, 0);
  for (int64_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + 1);
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(0, bytes);
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, bytes);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE(a->CopyFromHost(host.data(), bytes).ok());
  ASSERT_TRUE(b->Fill(0).ok());

  absl::StatusOr<CudaStream> stream = CudaStream::Create(0);
  absl::StatusOr<CudaEvent> done = CudaEvent::Create(0);
  ASSERT_TRUE(stream.ok() && done.ok());
  ASSERT_EQ(cudaMemcpyAsync(b->data(), a->data(), bytes, cudaMemcpyDeviceToDevice, stream->get()),
            cudaSuccess);
  ASSERT_TRUE(done->Record(stream->get()).ok());
  PollBackoff backoff;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    absl::StatusOr<bool> complete = done->Query();
    ASSERT_TRUE(complete.ok()) << complete.status();
    if (*complete) break;
    ASSERT_LT(absl::Now(), deadline);
    backoff.Sleep(deadline);
  }
  // Moving keeps the memory; the moved-from buffer owns nothing.
  void* const data = b->data();
  DeviceBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(b->size(), 0);
  ASSERT_TRUE(moved.CopyToHost(back.data(), bytes).ok());
  EXPECT_EQ(std::memcmp(host.data(), back.data(), bytes), 0);
  EXPECT_EQ(moved.CopyToHost(back.data(), 2, bytes - 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuDeviceTest, OutOfMemoryIsResourceExhausted) {
  absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Allocate(0, int64_t{1} << 50);  // 1 PiB
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_THAT(huge.status().message(), HasSubstr("cudaMalloc"));
  cudaGetLastError();  // clear the (non-sticky) error
}

TEST(GpuDeviceTest, OneRankCommunicatorSplitsAndAborts) {
  absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::StatusOr<NcclComm> world = NcclComm::InitRank(*id, 1, 0, 0, deadline);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_TRUE(world->valid());
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->AsyncState(), ncclSuccess);
  const std::vector<int32_t> node_of_rank = {0};
  absl::StatusOr<NcclHierarchy> tiers = SplitIntraInterNode(*world, node_of_rank, deadline);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  EXPECT_EQ(tiers->intra_node.size(), 1);
  EXPECT_EQ(tiers->inter_node.size(), 1);
  EXPECT_EQ(tiers->local_index, 0);
  const std::vector<int32_t> wrong = {0, 0};
  EXPECT_EQ(SplitIntraInterNode(*world, wrong, deadline).status().code(),
            absl::StatusCode::kInvalidArgument);
  world->Abort();
  EXPECT_FALSE(world->valid());
}

TEST(GpuDeviceTest, MissingRankAtInitIsDeadlineExceeded) {
  absl::StatusOr<std::string> id = NcclComm::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<NcclComm> comm =
      NcclComm::InitRank(*id, 2, 0, 0, start + absl::Seconds(2));  // rank 1 never comes
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(comm.status().message(), HasSubstr("rank 0 of 2"));
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(15)) << "abort of the half-made communicator took too long";
}

}  // namespace
}  // namespace hsap::gpu

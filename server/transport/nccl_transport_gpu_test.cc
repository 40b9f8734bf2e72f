// Tagged "gpu": the NCCL transport on real devices, one rank per visible GPU
// as threads of this process (NCCL refuses two ranks of one communicator on
// one GPU).
//   * any GPU count: one rank exchanging several buffers with itself
//     (ncclSend/ncclRecv to self in one group: the full post/poll path),
//     counters, an exchange with nothing to move, Abort, a stream stalled
//     past the deadline (DEADLINE_EXCEEDED, then the endpoint is aborted),
//     a second rank that never joins (DEADLINE_EXCEEDED at init), and two
//     ranks on one GPU (either it works and moves the right bytes, or both
//     ranks get a clear error in bounded time — never a hang);
//   * >= 2 GPUs: all-to-all stages checked byte for byte with counters by
//     tier, a peer that never posts (DEADLINE_EXCEEDED), Abort from another
//     thread during Wait (the abort's status).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/gpu/cuda_device.h"
#include "server/gpu/device_buffer.h"
#include "server/transport/nccl_transport.h"

namespace hsap::transport {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using gpu::DeviceBuffer;

int GpuCount() {
  absl::StatusOr<int> count = gpu::VisibleDeviceCount();
  return count.ok() ? *count : 0;
}

// Deterministic bytes of message (stage, src, dst, k).
std::vector<unsigned char> Pattern(int stage, int src, int dst, int k, int64_t bytes) {
  std::vector<unsigned char> out(bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t(stage) << 48) ^ (uint64_t(src) << 32) ^
               (uint64_t(dst) << 16) ^ uint64_t(k);
  for (int64_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<unsigned char>(x);
  }
  return out;
}

// Runs fn(rank) on `n` threads and joins them.
void RunRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

NcclTransportOptions Options(const std::string& id, int nranks, int rank, int device,
                             std::vector<int32_t> node_of_rank = {}) {
  NcclTransportOptions o;
  o.unique_id = id;
  o.nranks = nranks;
  o.rank = rank;
  o.device = device;
  o.node_of_rank = std::move(node_of_rank);
  o.init_deadline = absl::Now() + absl::Seconds(60);
  return o;
}

std::unique_ptr<NcclTransport> MustCreateOneRank() {
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(Options(*id, 1, 0, 0));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// --- One GPU is enough ---

TEST(NcclTransportGpuTest, SelfExchangesOfSeveralBuffers) {
  ASSERT_TRUE(NcclTransportBuilt());
  std::unique_ptr<NcclTransport> t = MustCreateOneRank();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->rank(), 0);
  EXPECT_EQ(t->size(), 1);
  EXPECT_EQ(t->TierOf(0), Tier::kIntraNode);
  const std::vector<int64_t> sizes = {0, 1, 4096, 1 << 20, 3 * (1 << 20) + 5, 64 << 20};
  int64_t total = 0;
  for (int stage = 0; stage < 3; ++stage) {
    std::vector<DeviceBuffer> out, in;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t bytes = sizes[(k + stage) % sizes.size()];
      absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(0, bytes);
      absl::StatusOr<DeviceBuffer> i = DeviceBuffer::Allocate(0, bytes);
      ASSERT_TRUE(o.ok() && i.ok());
      const std::vector<unsigned char> p = Pattern(stage, 0, 0, k, bytes);
      ASSERT_TRUE(o->CopyFromHost(p.data(), bytes).ok());
      ASSERT_TRUE(i->Fill(0xEE).ok());
      sends.push_back({0, o->data(), bytes});
      recvs.push_back({0, i->data(), bytes});
      out.push_back(std::move(*o));
      in.push_back(std::move(*i));
      total += bytes;
    }
    const absl::Status s = t->Exchange(100 + stage, sends, recvs, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(s.ok()) << s;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t bytes = in[k].size();
      std::vector<unsigned char> got(bytes);
      ASSERT_TRUE(in[k].CopyToHost(got.data(), bytes).ok());
      EXPECT_TRUE(got == Pattern(stage, 0, 0, k, bytes)) << "stage " << stage << " buffer " << k;
    }
  }
  // Nothing to move (zero-byte pairs only): completes at once.
  ASSERT_TRUE(t->Exchange(999, std::vector<SendOp>{{0, nullptr, 0}},
                          std::vector<RecvOp>{{0, nullptr, 0}}, absl::Now() + absl::Seconds(5))
                  .ok());
  const TransferCounters c = t->counters();
  EXPECT_EQ(c.sent_bytes[0], total);
  EXPECT_EQ(c.received_bytes[0], total);
  EXPECT_EQ(c.sent_bytes[1], 0);
  EXPECT_EQ(c.received_bytes[1], 0);
  // Unpaired self transfers are refused before NCCL sees them.
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, 16);
  ASSERT_TRUE(b.ok());
  auto unpaired = t->Start(5, std::vector<SendOp>{{0, b->data(), 16}}, {});
  EXPECT_EQ(unpaired.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(t->abort_status().ok());
}

TEST(NcclTransportGpuTest, AbortFailsLaterStartsWithTheReason) {
  std::unique_ptr<NcclTransport> t = MustCreateOneRank();
  ASSERT_NE(t, nullptr);
  t->Abort(absl::AbortedError("node 3 lost"));
  t->Abort(absl::UnavailableError("second reason"));  // the first one wins
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(0, 64);
  ASSERT_TRUE(b.ok());
  auto pending = t->Start(1, std::vector<SendOp>{{0, b->data(), 64}},
                          std::vector<RecvOp>{{0, b->data(), 64}});
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(pending.status().message(), HasSubstr("node 3 lost"));
  EXPECT_EQ(t->abort_status().code(), absl::StatusCode::kAborted);
}

TEST(NcclTransportGpuTest, MissingRankAtInitIsDeadlineExceeded) {
  ASSERT_GE(GpuCount(), 1) << "this test needs a visible GPU";
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclTransportOptions o = Options(*id, 2, 0, 0);
  const absl::Time start = absl::Now();
  o.init_deadline = start + absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded) << t.status();
  EXPECT_LT(took, absl::Seconds(15));
}

// NCCL does not support two ranks of one communicator on one GPU ("Duplicate
// GPU detected", ncclInvalidUsage). With one GPU this checks that the
// refusal is a clear status for both ranks in bounded time; should a future
// NCCL accept it, the exchange must then move the right bytes.
TEST(NcclTransportGpuTest, TwoRanksOnOneGpuWorkOrFailCleanly) {
  ASSERT_GE(GpuCount(), 1) << "this test needs a visible GPU";
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<absl::Status> created(2), exchanged(2);
  const absl::Time start = absl::Now();
  RunRanks(2, [&](int r) {
    NcclTransportOptions o = Options(*id, 2, r, 0);
    o.init_deadline = start + absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
    created[r] = t.status();
    if (!t.ok()) return;
    absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Allocate(0, 4096);
    absl::StatusOr<DeviceBuffer> in = DeviceBuffer::Allocate(0, 4096);
    const std::vector<unsigned char> p = Pattern(0, r, 1 - r, 0, 4096);
    if (!out.ok() || !in.ok() || !out->CopyFromHost(p.data(), 4096).ok()) {
      exchanged[r] = absl::InternalError("setup");
      return;
    }
    exchanged[r] = (*t)->Exchange(1, std::vector<SendOp>{{1 - r, out->data(), 4096}},
                                  std::vector<RecvOp>{{1 - r, in->data(), 4096}},
                                  absl::Now() + absl::Seconds(20));
    std::vector<unsigned char> got(4096);
    if (exchanged[r].ok() && in->CopyToHost(got.data(), 4096).ok() &&
        got != Pattern(0, 1 - r, r, 0, 4096)) {
      exchanged[r] = absl::DataLossError("wrong bytes");
    }
    if (!exchanged[r].ok()) (*t)->Abort(exchanged[r]);
  });
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(60));
  for (int r = 0; r < 2; ++r) {
    std::cout << "rank " << r << ": create " << created[r] << ", exchange " << exchanged[r] << "\n";
    if (created[r].ok()) {
      EXPECT_TRUE(exchanged[r].ok()) << exchanged[r];
    } else {
      EXPECT_THAT(created[r].code(), AnyOf(absl::StatusCode::kFailedPrecondition,
                                           absl::StatusCode::kInvalidArgument,
                                           absl::StatusCode::kDeadlineExceeded))
          << created[r];
    }
  }
}

// --- Two or more GPUs ---

int64_t AllToAllBytes(int stage, int src, int dst, int k) {
  static constexpr int64_t kSizes[] = {0, 1, 4096, 1 << 20, 3 * (1 << 20) + 5, 17, 300000};
  return kSizes[(stage * 5 + src * 3 + dst + k * 2) % 7];
}

TEST(NcclTransportGpuTest, AllToAllAcrossGpus) {
  const int n = std::min(GpuCount(), 8);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, " << n << " visible (the 1-GPU tests above ran)";
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<int32_t> node_of_rank(n);
  for (int r = 0; r < n; ++r) node_of_rank[r] = r / 2;  // pretend nodes of 2 GPUs
  constexpr int kStages = 4, kPerPair = 2;
  std::vector<absl::Status> result(n);
  std::vector<TransferCounters> counters(n);
  RunRanks(n, [&](int r) {
    absl::StatusOr<std::unique_ptr<NcclTransport>> t =
        NcclTransport::Create(Options(*id, n, r, r, node_of_rank));
    if (!t.ok()) {
      result[r] = t.status();
      return;
    }
    for (int stage = 0; stage < kStages && result[r].ok(); ++stage) {
      std::vector<DeviceBuffer> out, in;
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      std::vector<std::vector<unsigned char>> want;
      for (int k = 0; k < kPerPair; ++k) {
        for (int p = n - 1; p >= 0; --p) {  // any caller order will do
          const int64_t sb = AllToAllBytes(stage, r, p, k), rb = AllToAllBytes(stage, p, r, k);
          absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(r, sb);
          absl::StatusOr<DeviceBuffer> i = DeviceBuffer::Allocate(r, rb);
          if (!o.ok() || !i.ok()) {
            result[r] = absl::InternalError("alloc");
            return;
          }
          const std::vector<unsigned char> pat = Pattern(stage, r, p, k, sb);
          if (!o->CopyFromHost(pat.data(), sb).ok() || !i->Fill(0xAB).ok()) {
            result[r] = absl::InternalError("setup");
            return;
          }
          sends.push_back({p, o->data(), sb});
          recvs.push_back({p, i->data(), rb});
          want.push_back(Pattern(stage, p, r, k, rb));
          out.push_back(std::move(*o));
          in.push_back(std::move(*i));
        }
      }
      result[r] = (*t)->Exchange(1000 + stage, sends, recvs, absl::Now() + absl::Seconds(60));
      for (size_t m = 0; m < in.size() && result[r].ok(); ++m) {
        std::vector<unsigned char> got(in[m].size());
        if (!in[m].CopyToHost(got.data(), got.size()).ok() || got != want[m]) {
          result[r] = absl::DataLossError(absl::StrCat("rank ", r, " stage ", stage,
                                                       " message ", m, " has wrong bytes"));
        }
      }
    }
    counters[r] = (*t)->counters();
    if (!result[r].ok()) (*t)->Abort(result[r]);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(result[r].ok()) << "rank " << r << ": " << result[r];
    TransferCounters want;
    for (int stage = 0; stage < kStages; ++stage) {
      for (int k = 0; k < kPerPair; ++k) {
        for (int p = 0; p < n; ++p) {
          const int tier = node_of_rank[p] == node_of_rank[r] ? 0 : 1;
          want.sent_bytes[tier] += AllToAllBytes(stage, r, p, k);
          want.received_bytes[tier] += AllToAllBytes(stage, p, r, k);
        }
      }
    }
    for (int tier = 0; tier < 2; ++tier) {
      EXPECT_EQ(counters[r].sent_bytes[tier], want.sent_bytes[tier]) << "rank " << r;
      EXPECT_EQ(counters[r].received_bytes[tier], want.received_bytes[tier]) << "rank " << r;
    }
  }
}

// Rank 1 joins the group but never posts its half: rank 0's Wait ends with
// DEADLINE_EXCEEDED (deadline_case) or with the Abort() another thread
// calls during it.
void RunSilentPeer(bool deadline_case) {
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  absl::Status waited;
  absl::Duration took;
  absl::Notification rank0_done;
  RunRanks(2, [&](int r) {
    absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(Options(*id, 2, r, r));
    if (!t.ok()) {
      ADD_FAILURE() << "rank " << r << ": " << t.status();
      if (r == 0) rank0_done.Notify();
      return;
    }
    if (r == 1) {
      rank0_done.WaitForNotification();
      (*t)->Abort(absl::CancelledError("test over"));
      return;
    }
    absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(0, 1 << 20);
    absl::StatusOr<DeviceBuffer> i = DeviceBuffer::Allocate(0, 1 << 20);
    if (!o.ok() || !i.ok()) {
      ADD_FAILURE() << o.status() << i.status();
      rank0_done.Notify();  // rank 1 waits for it
      return;
    }
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + (deadline_case ? absl::Seconds(1) : absl::Seconds(60));
    std::thread aborter;
    if (!deadline_case) {
      aborter = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(300));
        (*t)->Abort(absl::AbortedError("peer node 1 is DOWN"));
      });
    }
    absl::StatusOr<std::unique_ptr<PendingExchange>> pending =
        (*t)->Start(5, std::vector<SendOp>{{1, o->data(), 1 << 20}},
                    std::vector<RecvOp>{{1, i->data(), 1 << 20}});
    waited = pending.ok() ? (*pending)->Wait(deadline) : pending.status();
    took = absl::Now() - start;
    if (aborter.joinable()) aborter.join();
    rank0_done.Notify();
  });
  if (deadline_case) {
    EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
    EXPECT_THAT(waited.message(), HasSubstr("exchange tag 5 on rank 0 of 2"));
    EXPECT_THAT(waited.message(), HasSubstr("receives from [1], sends to [1]"));
    EXPECT_GE(took, absl::Seconds(1));
    EXPECT_LT(took, absl::Seconds(1) + absl::Seconds(10));
  } else {
    EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
    EXPECT_THAT(waited.message(), HasSubstr("peer node 1 is DOWN"));
    EXPECT_LT(took, absl::Seconds(10));
  }
}

TEST(NcclTransportGpuTest, SilentPeerIsDeadlineExceeded) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (the 1-GPU deadline tests above ran)";
  RunSilentPeer(/*deadline_case=*/true);
}

TEST(NcclTransportGpuTest, AbortFromAnotherThreadEndsWait) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (the 1-GPU abort test above ran)";
  RunSilentPeer(/*deadline_case=*/false);
}

// Last in the file on purpose: it aborts a communicator whose kernel is
// still queued behind a blocked stream, the least trodden path of NCCL's
// abort; should that ever poison the CUDA context, no other test is hit.
//
// The stream is held by a host function until after the deadline: Wait
// reports DEADLINE_EXCEEDED naming the exchange, aborts the communicator,
// and later Starts fail.
void CUDART_CB BlockUntil(void* flag) {
  auto* release = static_cast<std::atomic<bool>*>(flag);
  while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(NcclTransportGpuTest, StalledStreamIsDeadlineExceeded) {
  std::unique_ptr<NcclTransport> t = MustCreateOneRank();
  ASSERT_NE(t, nullptr);
  std::atomic<bool> release{false};
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(t->stream(), BlockUntil, &release), cudaSuccess);
  absl::StatusOr<DeviceBuffer> o = DeviceBuffer::Allocate(0, 1 << 20);
  absl::StatusOr<DeviceBuffer> i = DeviceBuffer::Allocate(0, 1 << 20);
  ASSERT_TRUE(o.ok() && i.ok());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Milliseconds(500);
  // Released well after the deadline (so only the deadline can end Wait),
  // and for sure (so no CUDA or NCCL call can wait for the stream forever).
  std::thread releaser([&] {
    absl::SleepFor(deadline + absl::Seconds(1) - absl::Now());
    release = true;
  });
  absl::StatusOr<std::unique_ptr<PendingExchange>> pending =
      t->Start(77, std::vector<SendOp>{{0, o->data(), 1 << 20}},
               std::vector<RecvOp>{{0, i->data(), 1 << 20}});
  ASSERT_TRUE(pending.ok()) << pending.status();
  const absl::Status s = (*pending)->Wait(deadline);
  const absl::Duration took = absl::Now() - start;
  releaser.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(s.message(), HasSubstr("exchange tag 77 on rank 0 of 1"));
  EXPECT_THAT(s.message(), HasSubstr("the communicator is aborted"));
  EXPECT_GE(took, absl::Milliseconds(500));
  // deadline + the release delay + the bounded drain after the abort.
  EXPECT_LT(took, absl::Seconds(10));
  auto later = t->Start(78, std::vector<SendOp>{{0, o->data(), 8}},
                        std::vector<RecvOp>{{0, i->data(), 8}});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(later.status().message(), HasSubstr("exchange tag 77"));
  EXPECT_EQ(t->counters().sent_bytes[0], 0);
}

}  // namespace
}  // namespace hsap::transport

// Tests of the UCX transport: in one process (two workers, rank threads),
// across two processes (fork + exec, addresses over a socketpair), a peer
// killed mid-exchange, a missing peer, and Abort from another thread. Each
// runs over tcp and over shared memory (posix, sysv, cma, self).
#include "server/transport/ucx_transport.h"

#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/ucx_tag.h"
#include "server/transport/ucx_test_util.h"

namespace hsap::transport {
namespace {

using ::testing::HasSubstr;
using testing::CheckPattern;
using testing::ChildProcess;
using testing::FillPattern;
using testing::MessageSeed;
using testing::ReadBlob;
using testing::WriteBlob;

constexpr char kTcp[] = "tcp";
// tcp with UCX's own rendezvous threshold: large messages go rendezvous
// (plain tcp is eager at every size, ucx_worker.h EagerRndvThresh).
constexpr char kTcpRendezvous[] = "tcp+rndv";
constexpr char kSharedMemory[] = "posix,sysv,cma,self";

// The worker options a test parameter stands for.
UcxWorkerOptions OptionsFor(absl::string_view param) {
  if (absl::ConsumeSuffix(&param, "+rndv")) return {.transports = std::string(param), .rndv_thresh = "auto"};
  return {.transports = std::string(param)};
}

// ---------------------------------------------------------------------------
// A workload: `stages` grouped all-to-all exchanges among the ranks of
// node_of_rank; message sizes vary with (stage, src, dst) and include 0 B,
// 1 B, eager and rendezvous sizes.
int64_t AllToAllBytes(int stage, int src, int dst) {
  static constexpr int64_t kSizes[] = {0, 1, 4096, 1 << 20, 3 * (1 << 20) + 5, 17, 300000};
  return kSizes[(stage * 5 + src * 3 + dst) % 7];
}

// Runs the all-to-all stages on `t` and checks every byte received.
absl::Status RunAllToAll(Transport* t, int stages, absl::Time deadline) {
  const int n = t->size();
  for (int stage = 0; stage < stages; ++stage) {
    std::vector<std::vector<unsigned char>> out(n), in(n);
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (int p = 0; p < n; ++p) {
      out[p].resize(AllToAllBytes(stage, t->rank(), p));
      FillPattern(MessageSeed(stage, t->rank(), p, 0), out[p].data(), out[p].size());
      in[p].resize(AllToAllBytes(stage, p, t->rank()));
      sends.push_back({p, out[p].data(), static_cast<int64_t>(out[p].size())});
      recvs.push_back({p, in[p].data(), static_cast<int64_t>(in[p].size())});
    }
    absl::Status s = t->Exchange(1000 + stage, sends, recvs, deadline);
    if (!s.ok()) return s;
    for (int p = 0; p < n; ++p) {
      s = CheckPattern(MessageSeed(stage, p, t->rank(), 0), in[p].data(), in[p].size());
      if (!s.ok()) {
        return absl::InternalError(absl::StrCat("stage ", stage, " rank ", t->rank(),
                                                " from ", p, ": ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

TransferCounters ExpectedAllToAllCounters(const std::vector<int32_t>& node_of_rank, int rank,
                                          int stages) {
  TransferCounters c;
  for (int stage = 0; stage < stages; ++stage) {
    for (int p = 0; p < static_cast<int>(node_of_rank.size()); ++p) {
      const int tier = node_of_rank[p] == node_of_rank[rank] ? 0 : 1;
      c.sent_bytes[tier] += AllToAllBytes(stage, rank, p);
      c.received_bytes[tier] += AllToAllBytes(stage, p, rank);
    }
  }
  return c;
}

void ExpectCounters(const TransferCounters& got, const TransferCounters& want) {
  for (int tier = 0; tier < 2; ++tier) {
    EXPECT_EQ(got.sent_bytes[tier], want.sent_bytes[tier]) << "tier " << tier;
    EXPECT_EQ(got.received_bytes[tier], want.received_bytes[tier]) << "tier " << tier;
  }
}

// ---------------------------------------------------------------------------
// The child side of the two-process tests. It runs only when the parent
// spawned this binary with HSAP_UCX_CHILD_ROLE set.
//   HSAP_UCX_CHILD_FD    the socketpair end to the parent
//   HSAP_UCX_CHILD_TLS   the transports
//   HSAP_UCX_CHILD_ROLE  "alltoall" or "victim"
absl::Status ChildMain(const std::string& role, int fd, const std::string& tls) {
  const absl::Time deadline = absl::Now() + absl::Seconds(25);
  auto worker = UcxWorker::Create(OptionsFor(tls));
  if (!worker.ok()) return worker.status();
  absl::Status s = WriteBlob(fd, (*worker)->Address());
  if (!s.ok()) return s;
  auto parent_address = ReadBlob(fd, deadline);
  if (!parent_address.ok()) return parent_address.status();
  if (!(s = (*worker)->Connect(0, *parent_address)).ok()) return s;
  if (!(s = (*worker)->Connect(1, (*worker)->Address())).ok()) return s;

  if (role == "alltoall") {
    const std::vector<int32_t> nodes = {0, 0, 1, 1};
    absl::Status results[2];
    std::vector<std::thread> threads;
    for (int local = 0; local < 2; ++local) {
      threads.emplace_back([&, local] {
        auto t = UcxTransport::Create(worker->get(), {.recv_comm_id = 7, .send_comm_of_node = {7, 7},
                                                      .rank = 2 + local, .node_of_rank = nodes});
        results[local] = t.ok() ? RunAllToAll(t->get(), 4, deadline) : t.status();
        if (results[local].ok()) {
          const TransferCounters got = (*t)->counters();
          const TransferCounters want = ExpectedAllToAllCounters(nodes, 2 + local, 4);
          for (int tier = 0; tier < 2; ++tier) {
            if (got.sent_bytes[tier] != want.sent_bytes[tier] ||
                got.received_bytes[tier] != want.received_bytes[tier]) {
              results[local] = absl::InternalError(absl::StrCat("counters of rank ", 2 + local));
            }
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const absl::Status& r : results) {
      if (!r.ok()) return r;
    }
    // Side-channel barrier: the parent has received everything too, so
    // closing the endpoints cannot drop a message still in flight.
    if (!(s = WriteBlob(fd, "done")).ok()) return s;
    auto done = ReadBlob(fd, deadline);
    return done.ok() ? absl::OkStatus() : done.status();
  }
  if (role == "victim") {
    // Rank 1 of {node 0, node 1}: one good exchange, then it receives the
    // parent's message of the second exchange but never sends its own, and
    // waits to be killed.
    auto t = UcxTransport::Create(worker->get(), {.recv_comm_id = 9, .send_comm_of_node = {9, 9},
                                                  .rank = 1, .node_of_rank = {0, 1}});
    if (!t.ok()) return t.status();
    std::vector<unsigned char> out(1 << 20), in(1 << 20);
    FillPattern(MessageSeed(0, 1, 0, 0), out.data(), out.size());
    SendOp send{0, out.data(), static_cast<int64_t>(out.size())};
    RecvOp recv{0, in.data(), static_cast<int64_t>(in.size())};
    if (!(s = (*t)->Exchange(1, {&send, 1}, {&recv, 1}, deadline)).ok()) return s;
    std::vector<unsigned char> big(64 << 20);
    RecvOp big_recv{0, big.data(), static_cast<int64_t>(big.size())};
    if (!(s = WriteBlob(fd, "ready")).ok()) return s;
    if (!(s = (*t)->Exchange(2, {}, {&big_recv, 1}, deadline)).ok()) return s;
    // Exchange 3 waits for a message the parent never sends; the parent
    // kills us meanwhile (its own exchange 2 still waits for our reply).
    char never = 0;
    RecvOp never_recv{0, &never, 1};
    s = (*t)->Exchange(3, {}, {&never_recv, 1}, absl::Now() + absl::Seconds(60));
    return absl::InternalError(absl::StrCat("victim was not killed; exchange 3: ", s.ToString()));
  }
  return absl::InvalidArgumentError("unknown role " + role);
}

// The child side of the two-process tests: main() below runs it, instead
// of the tests, when HSAP_UCX_CHILD_ROLE is set.
[[noreturn]] void RunChild(const char* role) {
  const int fd = std::atoi(std::getenv("HSAP_UCX_CHILD_FD"));
  const absl::Status s = ChildMain(role, fd, std::getenv("HSAP_UCX_CHILD_TLS"));
  if (!s.ok()) {
    std::fprintf(stderr, "child (%s) failed: %s\n", role, s.ToString().c_str());
    std::_Exit(1);
  }
  std::_Exit(0);
}

// ---------------------------------------------------------------------------
TEST(UcxTag, FieldsDoNotOverlap) {
  using ucx_tag::Encode;
  const uint64_t base = Encode(5, 77, 123, 10, 20, 3);
  EXPECT_NE(base, Encode(6, 77, 123, 10, 20, 3));
  EXPECT_NE(base, Encode(5, 78, 123, 10, 20, 3));
  EXPECT_NE(base, Encode(5, 77, 123, 11, 20, 3));
  EXPECT_NE(base, Encode(5, 77, 123, 10, 21, 3));
  EXPECT_NE(base, Encode(5, 77, 123, 10, 20, 4));
  EXPECT_EQ(base, Encode(5, 77 + (1 << 20), 123, 10, 20, 3));  // the ordinal wraps
  // Swapping src and dst gives another tag (a -> b vs b -> a).
  EXPECT_NE(Encode(1, 1, 1, 2, 3, 0), Encode(1, 1, 1, 3, 2, 0));
  // The extremes stay in their fields.
  const uint64_t top = Encode(ucx_tag::kMaxComms - 1, 0, 0, 0, 0, 0);
  EXPECT_EQ(top >> 54, ucx_tag::kMaxComms - 1);
  EXPECT_EQ(Encode(0, 0, 0, ucx_tag::kMaxRanks - 1, 0, 0) >> 18, ucx_tag::kMaxRanks - 1);
  EXPECT_EQ(Encode(0, 0, 0, 0, 0, ucx_tag::kMaxMessagesPerPair - 1),
            static_cast<uint64_t>(ucx_tag::kMaxMessagesPerPair - 1));
}

class UcxTransportTest : public ::testing::TestWithParam<const char*> {
 protected:
  // Two workers (nodes 0 and 1) of this process, each connected to both.
  void MakeTwoNodes() {
    for (int node = 0; node < 2; ++node) {
      auto w = UcxWorker::Create(OptionsFor(GetParam()));
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(std::move(*w));
    }
    for (auto& w : workers_) {
      for (int node = 0; node < 2; ++node) {
        ASSERT_TRUE(w->Connect(node, workers_[node]->Address()).ok());
      }
    }
  }
  std::unique_ptr<UcxTransport> MakeTransport(int node, int rank, std::vector<int32_t> nodes,
                                              uint32_t comm = 1) {
    // Every node receives on `comm` (one group at a time on these workers).
    const int32_t max_node = *std::max_element(nodes.begin(), nodes.end());
    auto t = UcxTransport::Create(workers_[node].get(),
                                  {.recv_comm_id = comm,
                                   .send_comm_of_node = std::vector<uint32_t>(max_node + 1, comm),
                                   .rank = rank,
                                   .node_of_rank = std::move(nodes)});
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  std::vector<std::unique_ptr<UcxWorker>> workers_;
};

// (a) Two workers, rank threads, messages of 0 B, 1 B, 1 MiB and 64 MiB in
// one grouped exchange (self included), byte-for-byte, with counters.
TEST_P(UcxTransportTest, GroupedSizesAcrossTwoWorkers) {
  MakeTwoNodes();
  const std::vector<int32_t> nodes = {0, 1};
  const int64_t kSizes[] = {0, 1, 1 << 20, 64 << 20};
  absl::Status results[2];
  TransferCounters counters[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = MakeTransport(rank, rank, nodes);
      std::vector<std::vector<unsigned char>> out, in;
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      std::vector<uint64_t> seeds;
      for (int peer = 0; peer < 2; ++peer) {
        for (int k = 0; k < 4; ++k) {
          // 64 MiB only between the nodes (memory).
          const int64_t bytes = (k == 3 && peer == rank) ? 4096 : kSizes[k];
          out.emplace_back(bytes);
          FillPattern(MessageSeed(0, rank, peer, k), out.back().data(), bytes);
          in.emplace_back(bytes);
          seeds.push_back(MessageSeed(0, peer, rank, k));
        }
      }
      for (size_t i = 0; i < out.size(); ++i) {
        sends.push_back({static_cast<int32_t>(i / 4), out[i].data(),
                         static_cast<int64_t>(out[i].size())});
        recvs.push_back({static_cast<int32_t>(i / 4), in[i].data(),
                         static_cast<int64_t>(in[i].size())});
      }
      results[rank] = t->Exchange(42, sends, recvs, absl::Now() + absl::Seconds(20));
      for (size_t i = 0; results[rank].ok() && i < in.size(); ++i) {
        results[rank] = CheckPattern(seeds[i], in[i].data(), in[i].size());
      }
      counters[rank] = t->counters();
    });
  }
  for (auto& th : threads) th.join();
  const int64_t self_bytes = 0 + 1 + (1 << 20) + 4096;
  const int64_t cross_bytes = 0 + 1 + (1 << 20) + (64 << 20);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    TransferCounters want;
    want.sent_bytes[0] = want.received_bytes[0] = self_bytes;
    want.sent_bytes[1] = want.received_bytes[1] = cross_bytes;
    ExpectCounters(counters[rank], want);
  }
}

// Four ranks on two workers (two rank threads sharing each worker), several
// all-to-all stages.
TEST_P(UcxTransportTest, AllToAllFourRanksOneProcess) {
  MakeTwoNodes();
  const std::vector<int32_t> nodes = {0, 0, 1, 1};
  absl::Status results[4];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = MakeTransport(nodes[rank], rank, nodes);
      results[rank] = RunAllToAll(t.get(), 4, absl::Now() + absl::Seconds(20));
      if (results[rank].ok()) ExpectCounters(t->counters(), ExpectedAllToAllCounters(nodes, rank, 4));
      EXPECT_EQ(t->TierOf(rank ^ 1), Tier::kIntraNode);
      EXPECT_EQ(t->TierOf(rank ^ 2), Tier::kInterNode);
    });
  }
  for (auto& th : threads) th.join();
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank];
}

// (b) Two processes, 4 ranks (2 per process), several all-to-all stages.
TEST_P(UcxTransportTest, AllToAllTwoProcesses) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd mine(sv[0]), theirs(sv[1]);
  auto child = ChildProcess::Spawn(
      "-*",
      {"HSAP_UCX_CHILD_ROLE=alltoall", absl::StrCat("HSAP_UCX_CHILD_FD=", theirs.get()),
       absl::StrCat("HSAP_UCX_CHILD_TLS=", GetParam())},
      theirs.get());
  ASSERT_TRUE(child.ok()) << child.status();
  theirs.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(25);

  auto worker = UcxWorker::Create(OptionsFor(GetParam()));
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(WriteBlob(mine.get(), (*worker)->Address()).ok());
  auto child_address = ReadBlob(mine.get(), deadline);
  ASSERT_TRUE(child_address.ok()) << child_address.status();
  ASSERT_TRUE((*worker)->Connect(0, (*worker)->Address()).ok());
  ASSERT_TRUE((*worker)->Connect(1, *child_address).ok());

  const std::vector<int32_t> nodes = {0, 0, 1, 1};
  absl::Status results[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = UcxTransport::Create(worker->get(), {.recv_comm_id = 7, .send_comm_of_node = {7, 7},
                                                    .rank = rank, .node_of_rank = nodes});
      ASSERT_TRUE(t.ok());
      results[rank] = RunAllToAll(t->get(), 4, deadline);
      if (results[rank].ok()) {
        ExpectCounters((*t)->counters(), ExpectedAllToAllCounters(nodes, rank, 4));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank];
  auto done = ReadBlob(mine.get(), deadline);
  EXPECT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(WriteBlob(mine.get(), "done").ok());
  auto code = child->Wait(deadline);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << "the child process failed (its stderr is in the test log)";
}

// (c) The peer process is SIGKILLed mid-exchange: Wait fails (UNAVAILABLE
// from the endpoint, or DEADLINE_EXCEEDED at the deadline), never hangs.
TEST_P(UcxTransportTest, PeerKilledMidExchange) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd mine(sv[0]), theirs(sv[1]);
  auto child = ChildProcess::Spawn(
      "-*",
      {"HSAP_UCX_CHILD_ROLE=victim", absl::StrCat("HSAP_UCX_CHILD_FD=", theirs.get()),
       absl::StrCat("HSAP_UCX_CHILD_TLS=", GetParam())},
      theirs.get());
  ASSERT_TRUE(child.ok()) << child.status();
  theirs.reset();
  const absl::Time setup_deadline = absl::Now() + absl::Seconds(15);
  auto worker = UcxWorker::Create(OptionsFor(GetParam()));
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(WriteBlob(mine.get(), (*worker)->Address()).ok());
  auto child_address = ReadBlob(mine.get(), setup_deadline);
  ASSERT_TRUE(child_address.ok()) << child_address.status();
  ASSERT_TRUE((*worker)->Connect(0, (*worker)->Address()).ok());
  ASSERT_TRUE((*worker)->Connect(1, *child_address).ok());
  auto t = UcxTransport::Create(worker->get(), {.recv_comm_id = 9, .send_comm_of_node = {9, 9},
                                                .rank = 0, .node_of_rank = {0, 1}});
  ASSERT_TRUE(t.ok());

  std::vector<unsigned char> out(1 << 20), in(1 << 20);
  SendOp send{1, out.data(), static_cast<int64_t>(out.size())};
  RecvOp recv{1, in.data(), static_cast<int64_t>(in.size())};
  ASSERT_TRUE((*t)->Exchange(1, {&send, 1}, {&recv, 1}, setup_deadline).ok());
  ASSERT_TRUE(CheckPattern(MessageSeed(0, 1, 0, 0), in.data(), in.size()).ok());
  ASSERT_TRUE(ReadBlob(mine.get(), setup_deadline).ok());  // "ready"

  // Exchange 2: we send 64 MiB and wait for 64 MiB that will never come.
  std::vector<unsigned char> big_out(64 << 20), big_in(64 << 20);
  SendOp big_send{1, big_out.data(), static_cast<int64_t>(big_out.size())};
  RecvOp big_recv{1, big_in.data(), static_cast<int64_t>(big_in.size())};
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(300));
    child->Kill();
  });
  const absl::Duration kDeadline = absl::Seconds(10);
  const absl::Time start = absl::Now();
  const absl::Status s = (*t)->Exchange(2, {&big_send, 1}, {&big_recv, 1}, start + kDeadline);
  const absl::Duration took = absl::Now() - start;
  killer.join();
  std::fprintf(stderr, "[%s] survivor's Wait after SIGKILL: %s after %s\n", GetParam(),
               s.ToString().c_str(), absl::FormatDuration(took).c_str());
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsAborted(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(took, kDeadline + absl::Seconds(2));
  if (absl::IsUnavailable(s)) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("node 1"));
  }
  auto code = child->Wait(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, -SIGKILL);
}

// (d) A peer that never sends: DEADLINE_EXCEEDED at the deadline, naming it.
TEST_P(UcxTransportTest, MissingPeerDeadline) {
  MakeTwoNodes();
  auto t0 = MakeTransport(0, 0, {0, 1});
  auto t1 = MakeTransport(1, 1, {0, 1});  // exists, never calls Exchange
  std::vector<unsigned char> in(1000);
  RecvOp recv{1, in.data(), 1000};
  const absl::Time start = absl::Now();
  const absl::Status s = t0->Exchange(5, {}, {&recv, 1}, start + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("receive from rank 1 (node 1, 1000 B)"));
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(2));
  // The endpoint is usable again: the next exchange (both ranks) succeeds.
  std::vector<unsigned char> out(10, 7), got(10, 0);
  SendOp send{1, out.data(), 10};
  RecvOp recv1{0, got.data(), 10};
  std::thread peer([&] {
    // Rank 1 skipped exchange 5; it must still count it (matching rule).
    (void)t1->Start(5, {}, {});
    const absl::Status s1 = t1->Exchange(6, {}, {&recv1, 1}, absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(s1.ok()) << s1;
  });
  EXPECT_TRUE(t0->Exchange(6, {&send, 1}, {}, absl::Now() + absl::Seconds(10)).ok());
  peer.join();
  EXPECT_EQ(got, out);
}

// (e) Abort from another thread ends a Wait promptly with the abort status;
// later Starts fail with it too.
TEST_P(UcxTransportTest, AbortFromAnotherThread) {
  MakeTwoNodes();
  auto t0 = MakeTransport(0, 0, {0, 1});
  std::vector<unsigned char> in(1 << 20);
  RecvOp recv{1, in.data(), static_cast<int64_t>(in.size())};
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    t0->Abort(absl::AbortedError("peer node 1 went down"));
  });
  const absl::Time start = absl::Now();
  const absl::Status s = t0->Exchange(3, {}, {&recv, 1}, start + absl::Seconds(20));
  const absl::Duration took = absl::Now() - start;
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_EQ(s.message(), "peer node 1 went down");
  EXPECT_LT(took, absl::Seconds(5));  // the abort, not the 20 s deadline (loose for CI load)
  auto again = t0->Start(4, {}, {});
  EXPECT_TRUE(absl::IsAborted(again.status())) << again.status();
}

TEST_P(UcxTransportTest, InvalidArguments) {
  MakeTwoNodes();
  auto t0 = MakeTransport(0, 0, {0, 1});
  char byte = 0;
  SendOp bad_peer{2, &byte, 1};
  EXPECT_TRUE(absl::IsInvalidArgument(t0->Start(1, {&bad_peer, 1}, {}).status()));
  RecvOp negative{1, &byte, -1};
  EXPECT_TRUE(absl::IsInvalidArgument(t0->Start(1, {}, {&negative, 1}).status()));
  RecvOp null_data{1, nullptr, 8};
  EXPECT_TRUE(absl::IsInvalidArgument(t0->Start(1, {}, {&null_data, 1}).status()));
  std::vector<SendOp> too_many(65, SendOp{1, &byte, 1});
  EXPECT_THAT(std::string(t0->Start(1, too_many, {}).status().message()),
              HasSubstr("more than 64 messages with peer 1"));
  EXPECT_TRUE(absl::IsInvalidArgument(
      UcxTransport::Create(workers_[0].get(), {.recv_comm_id = 1024, .rank = 0, .node_of_rank = {0}})
          .status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      UcxTransport::Create(workers_[0].get(), {.recv_comm_id = 1, .rank = 1, .node_of_rank = {0}})
          .status()));
  // A node with no endpoint: FAILED_PRECONDITION naming it.
  auto t = MakeTransport(0, 0, {0, 5});
  SendOp to_missing{1, &byte, 1};
  const absl::Status s = t->Start(1, {&to_missing, 1}, {}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 5"));
}

// The send comm table: checked when set, needed before the first exchange,
// set once.
TEST_P(UcxTransportTest, SendCommTable) {
  MakeTwoNodes();
  auto make = [&](std::vector<uint32_t> table) {
    return UcxTransport::Create(workers_[0].get(), {.recv_comm_id = 3,
                                                    .send_comm_of_node = std::move(table),
                                                    .rank = 0,
                                                    .node_of_rank = {0, 1}});
  };
  EXPECT_THAT(std::string(make({3}).status().message()),
              HasSubstr("send_comm_of_node has 1 entries but rank 1 lives on node 1"));
  EXPECT_THAT(std::string(make({3, 1024}).status().message()),
              HasSubstr("send_comm_of_node[1] = 1024 must be < 1024"));
  EXPECT_THAT(std::string(make({4, 5}).status().message()),
              HasSubstr("send_comm_of_node[0] = 4 is this rank's own node, whose receives use "
                        "recv_comm_id 3"));
  auto t = make({});
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::Status early = (*t)->Start(1, {}, {}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  EXPECT_THAT(std::string(early.message()), HasSubstr("not set (SetSendComms)"));
  auto u = make({});
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*u)->SetSendComms({9, 5})));
  EXPECT_TRUE((*u)->SetSendComms({3, 5}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*u)->SetSendComms({3, 6})));
  EXPECT_TRUE(absl::IsFailedPrecondition((*t)->SetSendComms({3, 5})));  // after a Start
}

// Two groups of ranks {0 on node 0, 1 on node 1} on the same two workers at
// once, in lockstep (same exchange tags, same sizes, fresh ordinals), with
// numerically swapped receive ids: group A receives on 3 at node 0 and 7 at
// node 1, group B on 7 and 3. Each rank must get only its own group's bytes.
// Had a sender encoded its own receive id instead of the receiver's, A's
// messages to node 1 would carry 3, B's id there, and cross.
TEST_P(UcxTransportTest, PerReceiverCommIdsKeepConcurrentGroupsApart) {
  MakeTwoNodes();
  const std::vector<uint32_t> recv_comm[2] = {{3, 7}, {7, 3}};  // [group][node]
  constexpr int kStages = 6;
  absl::Status results[2][2];
  std::vector<std::thread> threads;
  for (int group = 0; group < 2; ++group) {
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, group, rank] {
        auto t = UcxTransport::Create(workers_[rank].get(),
                                      {.recv_comm_id = recv_comm[group][rank],
                                       .send_comm_of_node = recv_comm[group],
                                       .rank = rank,
                                       .node_of_rank = {0, 1}});
        if (!t.ok()) {
          results[group][rank] = t.status();
          return;
        }
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        for (int stage = 0; stage < kStages && results[group][rank].ok(); ++stage) {
          std::vector<std::vector<unsigned char>> out(2), in(2);
          std::vector<SendOp> sends;
          std::vector<RecvOp> recvs;
          for (int p = 0; p < 2; ++p) {
            // Equal sizes in both groups; the payload names the group.
            out[p].resize(AllToAllBytes(stage, rank, p));
            FillPattern(MessageSeed(stage + 1000 * group, rank, p, 0), out[p].data(),
                        out[p].size());
            in[p].resize(AllToAllBytes(stage, p, rank));
            sends.push_back({p, out[p].data(), static_cast<int64_t>(out[p].size())});
            recvs.push_back({p, in[p].data(), static_cast<int64_t>(in[p].size())});
          }
          absl::Status s = (*t)->Exchange(1000 + stage, sends, recvs, deadline);
          for (int p = 0; p < 2 && s.ok(); ++p) {
            s = CheckPattern(MessageSeed(stage + 1000 * group, p, rank, 0), in[p].data(),
                             in[p].size());
            if (!s.ok()) {
              s = absl::InternalError(absl::StrCat("group ", group, " stage ", stage, " rank ",
                                                   rank, " from ", p, ": ", s.message()));
            }
          }
          results[group][rank] = s;
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  for (int group = 0; group < 2; ++group) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(results[group][rank].ok()) << "group " << group << " rank " << rank << ": "
                                             << results[group][rank];
    }
  }
}

// The hazard the per-receiver ids remove, shown deterministically: two
// groups that receive on the same id on one worker. Group B's rank 1 posts
// its receive first; group A's rank 0 then sends to its own rank 1 with
// that id, and B's receive takes A's bytes.
TEST_P(UcxTransportTest, SameRecvCommOnOneWorkerCrosses) {
  MakeTwoNodes();
  auto a0 = MakeTransport(0, 0, {0, 1}, 5);
  auto b1 = MakeTransport(1, 1, {0, 1}, 5);
  ASSERT_TRUE(a0 != nullptr && b1 != nullptr);
  std::vector<unsigned char> a_out(4096), b_in(4096);
  FillPattern(MessageSeed(0, 0, 1, 0), a_out.data(), a_out.size());
  RecvOp recv{0, b_in.data(), static_cast<int64_t>(b_in.size())};
  SendOp send{1, a_out.data(), static_cast<int64_t>(a_out.size())};
  auto b_pending = b1->Start(1, {}, {&recv, 1});
  ASSERT_TRUE(b_pending.ok()) << b_pending.status();
  auto a_pending = a0->Start(1, {&send, 1}, {});
  ASSERT_TRUE(a_pending.ok()) << a_pending.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // Each wait progresses its own worker (over tcp the send needs its own).
  absl::Status a_done;
  std::thread a_thread([&] { a_done = (*a_pending)->Wait(deadline); });
  const absl::Status b_done = (*b_pending)->Wait(deadline);
  a_thread.join();
  ASSERT_TRUE(b_done.ok()) << b_done;
  ASSERT_TRUE(a_done.ok()) << a_done;
  EXPECT_EQ(b_in, a_out) << "group B's receive should have taken group A's message";
}

// Progress() moves an exchange's data with nobody in Wait (the executor
// calls it between the kernel waves a stage's transfers overlap): 16 MiB
// each way (rendezvous) complete and are counted on both sides before
// either side waits; Wait then has nothing left to do.
TEST_P(UcxTransportTest, ProgressCompletesAnExchangeBeforeWait) {
  MakeTwoNodes();
  constexpr int64_t kBytes = int64_t{16} << 20;
  absl::Status results[2];
  bool done_before_wait[2] = {false, false};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = MakeTransport(rank, rank, {0, 1});
      if (t == nullptr) return;
      std::vector<unsigned char> out(kBytes), in(kBytes);
      FillPattern(MessageSeed(0, rank, 1 - rank, 0), out.data(), kBytes);
      SendOp send{1 - rank, out.data(), kBytes};
      RecvOp recv{1 - rank, in.data(), kBytes};
      auto pending = t->Start(3, {&send, 1}, {&recv, 1});
      if (!pending.ok()) {
        results[rank] = pending.status();
        return;
      }
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (absl::Now() < give_up) {
        (*pending)->Progress();
        const TransferCounters c = t->counters();
        if (c.sent_bytes[1] == kBytes && c.received_bytes[1] == kBytes) {
          done_before_wait[rank] = true;
          break;
        }
        sched_yield();
      }
      results[rank] = (*pending)->Wait(absl::Now() + absl::Seconds(10));
      if (results[rank].ok()) {
        results[rank] = CheckPattern(MessageSeed(0, 1 - rank, rank, 0), in.data(), kBytes);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank];
    EXPECT_TRUE(done_before_wait[rank])
        << "rank " << rank << ": Progress() alone did not complete the exchange in 20 s";
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxTransportTest,
                         ::testing::Values(kTcp, kTcpRendezvous, kSharedMemory),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           const absl::string_view p = info.param;
                           return std::string(p == kTcp               ? "tcp"
                                              : p == kTcpRendezvous ? "tcp_rendezvous"
                                                                    : "shared_memory");
                         });

}  // namespace
}  // namespace hsap::transport

int main(int argc, char** argv) {
  if (const char* role = std::getenv("HSAP_UCX_CHILD_ROLE")) hsap::transport::RunChild(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

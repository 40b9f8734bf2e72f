// Tests of the NCCL transport that need no GPU (and build without CUDA):
// option checks, the posting order of an exchange against a brute-force
// model over many random exchanges, and the FAILED_PRECONDITION a machine
// without a GPU, or a build without CUDA, gets — never a crash.
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/nccl_ops.h"
#include "server/transport/nccl_transport.h"

namespace hsap::transport {
namespace {

using ::testing::HasSubstr;

NcclTransportOptions ValidOptions() {
  NcclTransportOptions o;
  o.unique_id = std::string(128, '\x01');
  o.nranks = 4;
  o.rank = 1;
  o.device = 0;
  o.node_of_rank = {0, 0, 1, 1};
  o.init_deadline = absl::Now() + absl::Seconds(2);
  return o;
}

void ExpectInvalid(const NcclTransportOptions& o, const std::string& text) {
  absl::Status checked = ValidateNcclTransportOptions(o);
  EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument) << checked;
  EXPECT_THAT(checked.message(), HasSubstr(text));
  // Create checks the same way, before touching CUDA.
  absl::Status created = NcclTransport::Create(o).status();
  EXPECT_EQ(created.code(), absl::StatusCode::kInvalidArgument) << created;
  EXPECT_THAT(created.message(), HasSubstr(text));
}

TEST(NcclTransportOptionsTest, BadArgumentsAreInvalidArgument) {
  EXPECT_TRUE(ValidateNcclTransportOptions(ValidOptions()).ok());
  NcclTransportOptions o = ValidOptions();
  o.unique_id = "short";
  ExpectInvalid(o, "unique_id is 5 bytes, expected 128");
  o = ValidOptions();
  o.unique_id.clear();
  ExpectInvalid(o, "unique_id is 0 bytes");
  o = ValidOptions();
  o.nranks = 0;
  o.node_of_rank.clear();
  ExpectInvalid(o, "nranks = 0 < 1");
  o = ValidOptions();
  o.rank = 4;
  ExpectInvalid(o, "rank 4 is outside [0, nranks = 4)");
  o = ValidOptions();
  o.rank = -1;
  ExpectInvalid(o, "rank -1 is outside");
  o = ValidOptions();
  o.device = -2;
  ExpectInvalid(o, "device = -2 < 0");
  o = ValidOptions();
  o.node_of_rank = {0, 0, 1};
  ExpectInvalid(o, "node_of_rank has 3 entries, nranks = 4");
  o = ValidOptions();
  o.node_of_rank = {0, 0, -1, 1};
  ExpectInvalid(o, "node_of_rank[2] = -1 < 0");
  o = ValidOptions();
  o.node_of_rank.clear();  // empty: all ranks on one node
  EXPECT_TRUE(ValidateNcclTransportOptions(o).ok());
}

// On a machine without a GPU (this project's CI) a valid Create is
// FAILED_PRECONDITION with the reason. Where a GPU is visible, a one-rank
// group forms instead: nccl_transport_gpu_test covers that machine.
TEST(NcclTransportTest, WithoutGpuCreateIsFailedPrecondition) {
  NcclTransportOptions o = ValidOptions();
  o.nranks = 1;
  o.rank = 0;
  o.node_of_rank.clear();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  if (id.ok()) {
    EXPECT_EQ(id->size(), 128u);
    o.unique_id = *id;
  } else {
    EXPECT_NE(id.status().code(), absl::StatusCode::kOk);
  }
  absl::StatusOr<std::unique_ptr<NcclTransport>> t = NcclTransport::Create(o);
  if (t.ok()) GTEST_SKIP() << "a GPU is visible: nccl_transport_gpu_test covers this machine";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  std::cout << "NewNcclUniqueId: " << id.status() << "\nCreate: " << t.status() << "\n";
  if (NcclTransportBuilt()) {
    EXPECT_THAT(t.status().message(), HasSubstr("no usable GPU"));
  } else {
    EXPECT_THAT(t.status().message(), HasSubstr("built without the CUDA toolkit"));
    EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

// --- The posting order (nccl_ops.h) ---

char buffers[64][1];  // distinct non-null addresses to tell operations apart

TEST(NcclOpsTest, OrderOfASmallExchange) {
  // Rank 1 of 4: sends to 3, 0, 1(self), 3; receives from 1(self), 2, 0, 3.
  const std::vector<SendOp> sends = {
      {3, buffers[0], 10}, {0, buffers[1], 20}, {1, buffers[2], 5}, {3, buffers[3], 30}};
  const std::vector<RecvOp> recvs = {
      {1, buffers[4], 5}, {2, buffers[5], 7}, {0, buffers[6], 0}, {3, buffers[7], 9}};
  absl::StatusOr<std::vector<NcclOp>> ops = OrderNcclOps(1, 4, sends, recvs);
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::vector<std::pair<bool, void*>> got;
  for (const NcclOp& op : *ops) got.push_back({op.send, op.data});
  const std::vector<std::pair<bool, void*>> want = {
      {true, buffers[1]},                       // peer 0: (zero-byte receive dropped), send
      {false, buffers[4]}, {true, buffers[2]},  // peer 1 (self): receive, send
      {false, buffers[5]},                      // peer 2: receive
      {false, buffers[7]}, {true, buffers[0]}, {true, buffers[3]}};  // peer 3
  EXPECT_EQ(got, want);
  EXPECT_EQ(DescribePeers(*ops), "receives from [1, 2, 3], sends to [0, 1, 3]");
}

TEST(NcclOpsTest, InvalidOperations) {
  const std::vector<RecvOp> none;
  auto bad_peer = OrderNcclOps(0, 2, std::vector<SendOp>{{2, buffers[0], 1}}, none);
  EXPECT_EQ(bad_peer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_peer.status().message(), HasSubstr("sends[0].peer = 2 is outside [0, 2)"));
  auto negative = OrderNcclOps(0, 2, {}, std::vector<RecvOp>{{1, buffers[0], 3}, {1, buffers[1], -1}});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("recvs[1].bytes = -1 < 0"));
  auto null = OrderNcclOps(0, 2, std::vector<SendOp>{{1, nullptr, 8}}, none);
  EXPECT_EQ(null.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null.status().message(), HasSubstr("sends[0].data is null with 8 bytes"));
  // A zero-byte operation may have no buffer.
  EXPECT_TRUE(OrderNcclOps(0, 2, std::vector<SendOp>{{1, nullptr, 0}}, none).ok());
}

TEST(NcclOpsTest, SelfTransfersMustPair) {
  auto unpaired = OrderNcclOps(1, 2, std::vector<SendOp>{{1, buffers[0], 4}}, {});
  EXPECT_EQ(unpaired.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(unpaired.status().message(),
              HasSubstr("sends to self (bytes [4]) do not pair with receives from self (bytes [])"));
  auto sizes = OrderNcclOps(
      1, 2, std::vector<SendOp>{{1, buffers[0], 4}, {1, buffers[1], 8}},
      std::vector<RecvOp>{{1, buffers[2], 8}, {1, buffers[3], 4}});
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInternal);
  auto paired = OrderNcclOps(
      1, 2, std::vector<SendOp>{{1, buffers[0], 4}, {1, buffers[1], 0}},
      std::vector<RecvOp>{{1, buffers[2], 4}, {1, buffers[3], 0}});
  EXPECT_TRUE(paired.ok()) << paired.status();
}

// Random exchanges of a whole group: every rank's list is sorted (peer
// ascending, receives before sends), keeps each (peer, direction)'s
// non-empty operations in the caller's order, and — what NCCL's matching
// then does — pairing the k-th send a->b with the k-th receive on b from a
// pairs exactly the operations the caller meant, size for size.
TEST(NcclOpsTest, RandomExchangesKeepTheMatchingRule) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 6);
    // messages[a][b]: the sizes of the messages a sends b, in order.
    std::vector<std::vector<std::vector<int64_t>>> messages(n, std::vector<std::vector<int64_t>>(n));
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        const int count = static_cast<int>(rng() % 3);
        for (int k = 0; k < count; ++k) messages[a][b].push_back(rng() % 4 == 0 ? 0 : 1 + rng() % 1000);
      }
    }
    // Ids of messages, to check which send meets which receive: the data
    // pointer encodes (src, dst, k).
    auto id = [n](int a, int b, int k) {
      return reinterpret_cast<void*>(static_cast<uintptr_t>(1 + ((a * n + b) * 8 + k)));
    };
    std::vector<std::vector<NcclOp>> posted(n);
    for (int r = 0; r < n; ++r) {
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      // Callers list operations in any order; interleave peers randomly while
      // keeping each pair's order.
      std::vector<int> next_send(n, 0), next_recv(n, 0);
      int remaining = 0;
      for (int p = 0; p < n; ++p) remaining += messages[r][p].size() + messages[p][r].size();
      while (remaining > 0) {
        const int p = rng() % n;
        if (rng() % 2 == 0 && next_send[p] < static_cast<int>(messages[r][p].size())) {
          const int k = next_send[p]++;
          sends.push_back({p, id(r, p, k), messages[r][p][k]});
          --remaining;
        } else if (next_recv[p] < static_cast<int>(messages[p][r].size())) {
          const int k = next_recv[p]++;
          recvs.push_back({p, id(p, r, k), messages[p][r][k]});
          --remaining;
        }
      }
      absl::StatusOr<std::vector<NcclOp>> ops = OrderNcclOps(r, n, sends, recvs);
      ASSERT_TRUE(ops.ok()) << ops.status();
      posted[r] = *ops;
      for (size_t i = 1; i < ops->size(); ++i) {
        const NcclOp& x = (*ops)[i - 1];
        const NcclOp& y = (*ops)[i];
        ASSERT_TRUE(x.peer < y.peer || (x.peer == y.peer && (!x.send || y.send)))
            << "trial " << trial << " rank " << r << " position " << i;
      }
    }
    // NCCL's matching: per (src, dst), the k-th posted send meets the k-th
    // posted receive.
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        std::vector<const NcclOp*> out, in;
        for (const NcclOp& op : posted[a]) if (op.send && op.peer == b) out.push_back(&op);
        for (const NcclOp& op : posted[b]) if (!op.send && op.peer == a) in.push_back(&op);
        ASSERT_EQ(out.size(), in.size()) << "trial " << trial << " " << a << "->" << b;
        for (size_t k = 0; k < out.size(); ++k) {
          EXPECT_EQ(out[k]->data, in[k]->data) << "trial " << trial << " " << a << "->" << b;
          EXPECT_EQ(out[k]->bytes, in[k]->bytes);
          EXPECT_GT(out[k]->bytes, 0);
        }
        size_t nonempty = 0;
        for (int64_t s : messages[a][b]) nonempty += s > 0 ? 1 : 0;
        EXPECT_EQ(out.size(), nonempty);
      }
    }
  }
}

}  // namespace
}  // namespace hsap::transport

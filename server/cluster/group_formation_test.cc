// Three Cluster instances in one process without --peers (run-time peers
// only), on loopback ports chosen at run time: a group on all three forms
// (one root, two members), agrees on a plan with per-receiver comm ids,
// references exactly its peers; a second group on two of them forms beside
// it; one node is destroyed: the others see it DOWN, abort with its peer
// id, fail both groups; released, the tables go back to this node alone.
// A root whose member never comes fails at the deadline naming it.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/cluster.h"

namespace hsap::cluster {
namespace {

using ::testing::HasSubstr;
using transport::UcxWorker;

constexpr int kNodes = 3;

struct Node {
  std::unique_ptr<UcxWorker> worker;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::atomic<int> node_aborts{0};
  std::atomic<int> last_aborted{-1};
};

class GroupFormationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (Node& n : nodes_) {
      auto worker = UcxWorker::Create({.transports = "tcp"});
      ASSERT_TRUE(worker.ok()) << worker.status();
      n.worker = std::move(*worker);
      n.cluster = std::make_unique<Cluster>();
      n.cluster->AddNodeAbortCallback([&n](int32_t peer, const absl::Status&) {
        n.last_aborted = peer;
        ++n.node_aborts;
      });
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(n.cluster->service());
      n.server = builder.BuildAndStart();
      ASSERT_NE(n.server, nullptr);
      n.address = absl::StrCat("127.0.0.1:", port);
      // Each node's own "measurement": node i computes at (i + 1) GFLOP/s.
      const double flops = 1e9 * (&n - nodes_ + 1);
      n.cluster->SetLocalProfile([flops](DType, int32_t) {
        plan::HardwareProfile p;
        p.attention_flops = flops;
        p.intra_bytes_per_s = 2e9;
        p.inter_bytes_per_s = 2e9;
        p.intra_latency_s = 1e-5;
        return absl::StatusOr<plan::HardwareProfile>(p);
      });
      ClusterOptions o;
      o.advertise_address = n.address;
      o.heartbeat_period = absl::Milliseconds(50);
      o.suspect_after = absl::Milliseconds(200);
      o.down_after = absl::Milliseconds(400);
      o.rpc_timeout = absl::Milliseconds(200);
      o.peer_linger = absl::Milliseconds(100);
      o.insecure_peers = true;  // loopback
      ASSERT_TRUE(n.cluster->Start(o, n.worker.get()).ok());
      EXPECT_TRUE(n.cluster->formed());  // nothing static to wait for
      EXPECT_EQ(n.cluster->node_rank(), 0);
      EXPECT_EQ(n.cluster->self_address(), n.address);
    }
  }
  void TearDown() override {
    for (int i = 0; i < kNodes; ++i) Destroy(i);
  }
  void Destroy(int i) {
    Node& n = nodes_[i];
    if (n.server == nullptr) return;
    n.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    n.server.reset();
    n.cluster.reset();
    n.worker.reset();
  }
  std::vector<std::string> Addresses(const std::vector<int>& which) const {
    std::vector<std::string> out;
    for (int i : which) out.push_back(nodes_[i].address);
    return out;
  }
  // Acquires and forms `group` on `which` at once; returns each node's
  // peer ids (group node order) and status.
  std::vector<absl::Status> Form(const std::string& group, const std::vector<int>& which,
                                 std::vector<std::vector<int32_t>>* ids) {
    const std::vector<std::string> addresses = Addresses(which);
    std::vector<absl::Status> results(which.size());
    ids->assign(which.size(), {});
    std::vector<std::thread> threads;
    for (size_t k = 0; k < which.size(); ++k) {
      threads.emplace_back([&, k] {
        Cluster& c = *nodes_[which[k]].cluster;
        auto peers = c.AcquireGroup(group, addresses, static_cast<int32_t>(k));
        if (!peers.ok()) {
          results[k] = peers.status();
          return;
        }
        (*ids)[k] = *peers;
        results[k] = c.FormGroup(group, absl::Now() + absl::Seconds(10));
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }
  template <typename F>
  bool Eventually(F condition, absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (condition()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return condition();
  }

  Node nodes_[kNodes];
};

TEST_F(GroupFormationTest, FormsAgreesFailsApartAndReleases) {
  std::vector<std::vector<int32_t>> g_ids, h_ids;
  for (const absl::Status& st : Form("G", {0, 1, 2}, &g_ids)) ASSERT_TRUE(st.ok()) << st;
  for (const absl::Status& st : Form("H", {1, 2}, &h_ids)) ASSERT_TRUE(st.ok()) << st;
  // The same uid everywhere, assigned by the root (node 0); H's by node 1.
  uint64_t uid = 0;
  for (int i = 0; i < kNodes; ++i) {
    std::vector<GroupStatus> groups = nodes_[i].cluster->GroupStates();
    ASSERT_EQ(groups.size(), i == 0 ? 1u : 2u) << "node " << i;
    EXPECT_EQ(groups[0].name, "G");
    EXPECT_EQ(groups[0].state, GroupState::kUp);
    if (i == 0) uid = groups[0].uid;
    EXPECT_EQ(groups[0].uid, uid);
    EXPECT_NE(uid, 0u);
    // Each node's own place is itself (id 0); the peers get fresh ids.
    EXPECT_EQ(g_ids[i][i], 0);
    EXPECT_EQ(nodes_[i].cluster->PeerCounts()[static_cast<int>(NodeState::kUp)], 2);
  }
  // Node 1 references node 2 from both groups: the same peer id.
  EXPECT_EQ(g_ids[1][2], h_ids[0][1]);

  // The plan agreement runs on the run-time peers, per receiver comm ids.
  std::vector<absl::StatusOr<std::vector<uint32_t>>> agreed(kNodes);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    threads.emplace_back([&, i] {
      agreed[i] = nodes_[i].cluster->AgreePlan({"G", 1, false}, "key", 10 + i,
                                               absl::Now() + absl::Seconds(10), g_ids[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(agreed[i].ok()) << agreed[i].status();
    EXPECT_EQ(*agreed[i], (std::vector<uint32_t>{10, 11, 12})) << "node " << i;
  }
  for (int i = 0; i < kNodes; ++i) nodes_[i].cluster->EndCall("G", 1);

  // Node 2 goes: nodes 0 and 1 see it DOWN (abort with its id), and every
  // group with it fails; a later call of G must use a new name.
  const int32_t node2_on_0 = g_ids[0][2], node2_on_1 = g_ids[1][2];
  Destroy(2);
  ASSERT_TRUE(Eventually([&] { return nodes_[0].node_aborts > 0 && nodes_[1].node_aborts > 0; },
                         absl::Seconds(5)));
  EXPECT_EQ(nodes_[0].last_aborted, node2_on_0);
  EXPECT_EQ(nodes_[1].last_aborted, node2_on_1);
  for (int i = 0; i < 2; ++i) {
    for (const GroupStatus& g : nodes_[i].cluster->GroupStates()) {
      EXPECT_EQ(g.state, GroupState::kFailed) << g.name << " on node " << i;
    }
    auto later = nodes_[i].cluster->AcquireGroup("G", Addresses({0, 1, 2}), i);
    ASSERT_EQ(later.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(later.status().message(), HasSubstr("form the group again under a new group name"));
  }
  // Released (the matcher's release, and each call's references): back to
  // this node alone after the linger.
  for (int i = 0; i < 2; ++i) {
    nodes_[i].cluster->ReleaseGroup("G");
    nodes_[i].cluster->ReleaseGroup("H");
    nodes_[i].cluster->ReleaseCallPeers(g_ids[i]);
  }
  nodes_[1].cluster->ReleaseCallPeers(h_ids[0]);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Eventually([&] { return nodes_[i].cluster->NodeStates().size() == 1; },
                           absl::Seconds(5)))
        << "node " << i << " holds " << nodes_[i].cluster->NodeStates().size() << " peers";
    EXPECT_TRUE(nodes_[i].cluster->GroupStates().empty());
    EXPECT_EQ(nodes_[i].cluster->PeerCounts(), (std::array<int, 4>{0, 0, 0, 0}));
  }
  // A new group of 0 and 1 forms again on the parked endpoints: the same
  // peer ids, and neither node reconnects (closing one side would break
  // the other's endpoint: peer_table.h).
  const uint64_t generation0 = nodes_[0].worker->ConnectionGeneration(g_ids[0][1]);
  const uint64_t generation1 = nodes_[1].worker->ConnectionGeneration(g_ids[1][0]);
  EXPECT_GE(generation0, 1u);
  std::vector<std::vector<int32_t>> again;
  for (const absl::Status& st : Form("G2", {0, 1}, &again)) ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(again[0][1], g_ids[0][1]);
  EXPECT_EQ(again[1][0], g_ids[1][0]);
  EXPECT_EQ(nodes_[0].worker->ConnectionGeneration(again[0][1]), generation0);
  EXPECT_EQ(nodes_[1].worker->ConnectionGeneration(again[1][0]), generation1);
  EXPECT_TRUE(nodes_[0].worker->NodeStatus(again[0][1]).ok());
}

TEST_F(GroupFormationTest, ARootWhoseMemberNeverComesFailsAtTheDeadline) {
  const std::vector<std::string> addresses = Addresses({0, 1});
  auto peers = nodes_[0].cluster->AcquireGroup("lonely", addresses, 0);
  ASSERT_TRUE(peers.ok()) << peers.status();
  const absl::Time start = absl::Now();
  const absl::Status st = nodes_[0].cluster->FormGroup("lonely", start + absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  // Named with what the root last learned of it (its ConfirmMember answer).
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("member node(s) 1 (", nodes_[1].address,
                                                   "; last: its ranks have not declared the "
                                                   "group there) never joined its root")));
  // The node named is referenced but never dialled for liveness (no
  // incarnation known), and the group is FAILED.
  EXPECT_EQ(nodes_[0].cluster->GroupStates()[0].state, GroupState::kFailed);
  // This daemon's own address in the wrong place is refused.
  auto wrong = nodes_[1].cluster->AcquireGroup("x", addresses, 0);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("does not name this daemon"));
}

// The measured profile: every node of a group settles on its root's
// compute rate and the root's probed links, whichever node asks first.
TEST_F(GroupFormationTest, EveryMemberPlansWithTheRootsMeasuredProfile) {
  std::vector<std::vector<int32_t>> ids;
  for (const absl::Status& st : Form("P", {1, 0, 2}, &ids)) ASSERT_TRUE(st.ok()) << st;
  std::vector<absl::StatusOr<std::string>> got(kNodes, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int k = 0; k < kNodes; ++k) {
    threads.emplace_back([&, k] {
      got[k] = nodes_[k].cluster->GroupProfile("P", true, DType::kBFloat16, 128,
                                              absl::Now() + absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kNodes; ++k) ASSERT_TRUE(got[k].ok()) << k << ": " << got[k].status();
  EXPECT_EQ(*got[0], *got[1]);
  EXPECT_EQ(*got[2], *got[1]);
  auto p = plan::ParseHardwareProfile(*got[1]);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->attention_flops, 2e9);  // the root is node 1 (first in the list)
  // Loopback gRPC moves more than 10 MB/s, in well under 100 ms a round trip.
  EXPECT_GT(p->inter_bytes_per_s, 1e7);
  EXPECT_GT(p->inter_latency_s, 0);
  EXPECT_LT(p->inter_latency_s, 0.1);
  // The root probed both members; the members probed nobody.
  for (const NodeStatus& s : nodes_[1].cluster->NodeStates()) {
    if (s.address == nodes_[1].address) continue;
    EXPECT_GT(s.link_bytes_per_s, 0) << s.address;
  }
  for (const NodeStatus& s : nodes_[0].cluster->NodeStates()) EXPECT_EQ(s.link_bytes_per_s, 0);
  EXPECT_EQ(nodes_[0].cluster->KnownGroupProfile("P", true, DType::kBFloat16, 128), *got[1]);
  EXPECT_EQ(nodes_[0].cluster->KnownGroupProfile("P", true, DType::kFloat32, 128), std::nullopt);
  ASSERT_EQ(nodes_[2].cluster->GroupStates()[0].profiles.size(), 1u);
  EXPECT_THAT(nodes_[2].cluster->GroupStates()[0].profiles[0], HasSubstr("bfloat16/d128 custom:"));
  // A group of the same members under another name reuses the links
  // (probed once per member incarnation).
  for (const absl::Status& st : Form("P2", {1, 0}, &ids)) ASSERT_TRUE(st.ok()) << st;
  auto second = nodes_[0].cluster->GroupProfile("P2", true, DType::kBFloat16, 128,
                                                absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(second.ok()) << second.status();
  double link_to_0 = 0;
  for (const NodeStatus& s : nodes_[1].cluster->NodeStates()) {
    if (s.address == nodes_[0].address) link_to_0 = s.link_bytes_per_s;
  }
  EXPECT_EQ(plan::ParseHardwareProfile(*second)->inter_bytes_per_s, link_to_0);
  EXPECT_LE(p->inter_bytes_per_s, link_to_0);  // P took the slowest of two links
}

TEST_F(GroupFormationTest, GroupProfileRequestsAreValidated) {
  std::vector<std::vector<int32_t>> ids;
  for (const absl::Status& st : Form("V", {0, 1}, &ids)) ASSERT_TRUE(st.ok()) << st;
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel(nodes_[0].address, grpc::InsecureChannelCredentials()));
  auto ask = [&](const v1::GroupProfileRequest& r, v1::GroupProfileResponse* out) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->GroupProfile(&context, r, out);
  };
  v1::GroupProfileRequest r;
  r.set_group("V");
  r.set_declared(true);
  r.set_dtype(v1::DTYPE_FLOAT32);
  r.set_head_dim(0);
  r.set_address(nodes_[1].address);
  r.set_incarnation(nodes_[1].cluster->incarnation());
  v1::GroupProfileResponse out;
  grpc::Status s = ask(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("head_dim is 0"));
  r.set_head_dim(64);
  r.set_dtype(v1::DTYPE_INT32);
  s = ask(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("dtype is DTYPE_INT32"));
  // Not a member: node 2 asks about V.
  r.set_dtype(v1::DTYPE_FLOAT32);
  r.set_address(nodes_[2].address);
  s = ask(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("is not a member of the group"));
  EXPECT_FALSE(out.ready());  // and nothing probed
  // A member's address and incarnation without the group's key: refused.
  r.set_address(nodes_[1].address);
  r.set_incarnation(nodes_[1].cluster->incarnation());
  s = ask(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("does not carry the group's key"));
  // The member itself (which holds the key) gets the root's profile.
  auto got = nodes_[1].cluster->GroupProfile("V", true, DType::kFloat32, 64,
                                             absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(plan::ParseHardwareProfile(*got)->attention_flops, 1e9);
  // An undeclared group goes to node 0 of a static cluster; there is none.
  r.set_declared(false);
  s = ask(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
}

}  // namespace
}  // namespace hsap::cluster

// Three Cluster instances in one process on loopback ports chosen at run
// time: they form, agree on plans, abort calls; one is destroyed and the
// others see it DOWN and abort; it comes back (new incarnation), the others
// re-form (epoch increases) and UCX messages flow again.
#include "server/cluster/cluster.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/ucx_transport.h"

namespace hsap::cluster {
namespace {

using ::testing::HasSubstr;
using transport::UcxTransport;
using transport::UcxWorker;

constexpr int kNodes = 3;

struct TestNode {
  std::unique_ptr<UcxWorker> worker;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::atomic<int> node_aborts{0};
  std::atomic<int> last_aborted_node{-1};
  std::atomic<int> call_aborts{0};
};

class ClusterTest : public ::testing::Test {
 protected:
  // Creates node i's worker, cluster and server (port 0: chosen now, or the
  // given port when it comes back).
  void Create(int i, int port) {
    TestNode& n = nodes_[i];
    auto worker = UcxWorker::Create({});
    ASSERT_TRUE(worker.ok()) << worker.status();
    n.worker = std::move(*worker);
    n.cluster = std::make_unique<Cluster>();
    n.cluster->AddNodeAbortCallback([&n](int32_t node, const absl::Status&) {
      n.last_aborted_node = node;
      ++n.node_aborts;
    });
    n.cluster->AddCallAbortCallback(
        [&n](const std::string&, uint64_t, const absl::Status&) { ++n.call_aborts; });
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &n.port);
    builder.RegisterService(n.cluster->service());
    n.server = builder.BuildAndStart();
    ASSERT_NE(n.server, nullptr);
    ASSERT_GT(n.port, 0);
  }

  ClusterOptions Options(int i) const {
    ClusterOptions o;
    for (int j = 0; j < kNodes; ++j) o.peers.push_back(absl::StrCat("127.0.0.1:", nodes_[j].port));
    o.node_rank = i;
    // Short enough that losing a node shows within seconds, long enough that
    // a busy machine does not lose one: with 300 / 600 ms, CI's plain stage
    // (four actions on 2 cores) once saw node 2 fall back to JOINING right
    // after the cluster formed.
    o.heartbeat_period = absl::Milliseconds(100);
    o.suspect_after = absl::Milliseconds(1000);
    o.down_after = absl::Milliseconds(2000);
    o.rpc_timeout = absl::Milliseconds(500);
    o.join_timeout = absl::Seconds(10);
    o.insecure_peers = true;  // loopback
    return o;
  }

  void Destroy(int i) {
    TestNode& n = nodes_[i];
    n.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(100)));
    n.server.reset();
    n.cluster.reset();
    n.worker.reset();
  }

  // Every node sends every node (itself included) a message through UCX.
  void ExpectUcxAllToAll(uint32_t comm) {
    absl::Status results[kNodes];
    std::vector<std::thread> threads;
    for (int i = 0; i < kNodes; ++i) {
      threads.emplace_back([&, i] {
        auto t = UcxTransport::Create(nodes_[i].worker.get(),
                                      {.recv_comm_id = comm,
                                       .send_comm_of_node = {comm, comm, comm},
                                       .rank = i,
                                       .node_of_rank = {0, 1, 2}});
        if (!t.ok()) {
          results[i] = t.status();
          return;
        }
        std::vector<int64_t> out(kNodes), in(kNodes, -1);
        std::vector<transport::SendOp> sends;
        std::vector<transport::RecvOp> recvs;
        for (int p = 0; p < kNodes; ++p) {
          out[p] = comm * 100 + i * 10 + p;
          sends.push_back({p, &out[p], 8});
          recvs.push_back({p, &in[p], 8});
        }
        results[i] = (*t)->Exchange(1, sends, recvs, absl::Now() + absl::Seconds(10));
        for (int p = 0; results[i].ok() && p < kNodes; ++p) {
          if (in[p] != comm * 100 + p * 10 + i) {
            results[i] = absl::InternalError(absl::StrCat("node ", i, " from ", p, ": ", in[p]));
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kNodes; ++i) EXPECT_TRUE(results[i].ok()) << results[i];
  }

  void StartAll(const std::vector<int>& which) {
    absl::Status results[kNodes];
    std::vector<std::thread> threads;
    for (int i : which) {
      threads.emplace_back([&, i] { results[i] = nodes_[i].cluster->Start(Options(i), nodes_[i].worker.get()); });
    }
    for (auto& t : threads) t.join();
    for (int i : which) ASSERT_TRUE(results[i].ok()) << "node " << i << ": " << results[i];
  }

  // Polls `condition` up to `timeout`.
  template <typename F>
  bool Eventually(F condition, absl::Duration timeout) {
    const absl::Time give_up = absl::Now() + timeout;
    while (absl::Now() < give_up) {
      if (condition()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return condition();
  }

  void TearDown() override {
    for (int i = 0; i < kNodes; ++i) {
      if (nodes_[i].server != nullptr) Destroy(i);
    }
  }

  TestNode nodes_[kNodes];
};

TEST_F(ClusterTest, FormsAgreesLosesANodeAndReforms) {
  for (int i = 0; i < kNodes; ++i) Create(i, 0);
  StartAll({0, 1, 2});
  for (int i = 0; i < kNodes; ++i) {
    EXPECT_TRUE(nodes_[i].cluster->formed());
    for (const NodeStatus& s : nodes_[i].cluster->NodeStates()) {
      EXPECT_EQ(s.state, NodeState::kUp) << "node " << i << " sees " << s.node_rank;
      EXPECT_NE(s.incarnation, 0u);
    }
  }
  ExpectUcxAllToAll(1);

  // Plan agreement: same key everywhere -> OK; one node differs -> every
  // node FAILED_PRECONDITION.
  {
    absl::Status same[kNodes], differ[kNodes];
    std::vector<std::thread> threads;
    for (int i = 0; i < kNodes; ++i) {
      threads.emplace_back([&, i] {
        const absl::Time deadline = absl::Now() + absl::Seconds(5);
        // Each node receives on its own comm id; every node learns them all.
        auto agreed = nodes_[i].cluster->AgreePlan({"g", 1, false}, "plan-A", 10 + i, deadline);
        same[i] = agreed.status();
        if (agreed.ok() && *agreed != std::vector<uint32_t>{10, 11, 12}) {
          same[i] = absl::InternalError(
              absl::StrCat("node ", i, " learnt comm ids ", absl::StrJoin(*agreed, ",")));
        }
        differ[i] = nodes_[i]
                        .cluster
                        ->AgreePlan({"g", 2, false}, i == 1 ? "plan-B" : "plan-A", 20 + i, deadline)
                        .status();
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kNodes; ++i) {
      EXPECT_TRUE(same[i].ok()) << same[i];
      EXPECT_TRUE(absl::IsFailedPrecondition(differ[i])) << "node " << i << ": " << differ[i];
    }
    EXPECT_THAT(std::string(differ[1].message()), HasSubstr("plan-B"));
  }
  // A missing node: the deadline names it.
  {
    const absl::Status s = nodes_[0]
                               .cluster
                               ->AgreePlan({"g", 3, false}, "plan-A", 5,
                                           absl::Now() + absl::Milliseconds(300))
                               .status();
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    // Named by address and incarnation (PeerName), in member order.
    EXPECT_THAT(std::string(s.message()),
                ::testing::ContainsRegex(absl::StrCat(
                    "not confirmed: 127.0.0.1:", nodes_[1].port, "#[0-9]+, 127.0.0.1:",
                    nodes_[2].port, "#[0-9]+")));
  }
  // A group on nodes {0, 1} agrees without node 2 (which is never asked),
  // and waits only for its own members.
  {
    absl::StatusOr<std::vector<uint32_t>> agreed[2];
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        agreed[i] = nodes_[i].cluster->AgreePlan({"pair", 1, false}, "plan-P", 30 + i,
                                                 absl::Now() + absl::Seconds(5), {0, 1});
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(agreed[i].ok()) << agreed[i].status();
      // By member, in the order given.
      EXPECT_EQ(*agreed[i], (std::vector<uint32_t>{30, 31})) << "node " << i;
    }
    const absl::Status missing =
        nodes_[0]
            .cluster->AgreePlan({"pair", 2, false}, "plan-P", 5,
                                absl::Now() + absl::Milliseconds(300), {0, 2})
            .status();
    EXPECT_TRUE(absl::IsDeadlineExceeded(missing)) << missing;
    EXPECT_THAT(std::string(missing.message()),
                ::testing::ContainsRegex(
                    absl::StrCat("not confirmed: 127.0.0.1:", nodes_[2].port, "#[0-9]+$")));
    const absl::Status not_member =
        nodes_[0]
            .cluster->AgreePlan({"pair", 3, false}, "plan-P", 5, absl::Now() + absl::Seconds(1),
                                {1, 2})
            .status();
    EXPECT_TRUE(absl::IsInvalidArgument(not_member)) << not_member;
    EXPECT_THAT(std::string(not_member.message()), HasSubstr("do not include this node (0)"));
    const absl::Status outside =
        nodes_[0]
            .cluster->AgreePlan({"pair", 3, false}, "plan-P", 5, absl::Now() + absl::Seconds(1),
                                {0, 5})
            .status();
    EXPECT_TRUE(absl::IsInvalidArgument(outside)) << outside;
    EXPECT_THAT(std::string(outside.message()),
                HasSubstr("plan agreement for group 'pair': member 5 is not a peer of this node"));
  }
  // AbortCall runs its own callbacks; the others record it (their
  // agreement for the call ends with it) and run theirs only for a call
  // they run as a multi-node call, which g/4 is not there (a peer never
  // ends a one-node call of the same name).
  {
    const int before1 = nodes_[1].call_aborts, before2 = nodes_[2].call_aborts;
    nodes_[0].cluster->AbortCall("g", 4, absl::AbortedError("kernel failed"));
    EXPECT_GT(nodes_[0].call_aborts, 0);
    for (int i : {1, 2}) {
      const absl::Status agreed =
          nodes_[i]
              .cluster->AgreePlan({"g", 4, false}, "plan-X", 4, absl::Now() + absl::Seconds(5))
              .status();
      EXPECT_TRUE(absl::IsAborted(agreed)) << i << ": " << agreed;
      EXPECT_THAT(std::string(agreed.message()), HasSubstr("kernel failed"));
    }
    EXPECT_EQ(nodes_[1].call_aborts, before1);
    EXPECT_EQ(nodes_[2].call_aborts, before2);
  }
  // An abort of a group on nodes {0, 1} does not reach node 2.
  {
    nodes_[0].cluster->AbortCall("pair", 9, absl::AbortedError("kernel failed"), {0, 1});
    const absl::Status on1 =
        nodes_[1]
            .cluster->AgreePlan({"pair", 9, false}, "plan-P", 4, absl::Now() + absl::Seconds(5),
                                {0, 1})
            .status();
    EXPECT_TRUE(absl::IsAborted(on1)) << on1;
    const absl::Status on2 =
        nodes_[2]
            .cluster->AgreePlan({"pair", 9, false}, "plan-P", 4,
                                absl::Now() + absl::Milliseconds(300), {0, 2})
            .status();
    EXPECT_TRUE(absl::IsDeadlineExceeded(on2)) << on2;
  }

  // Per-call peer requests with bad fields are refused, naming the field.
  {
    auto stub = v1::Peer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", nodes_[0].port),
                                                      grpc::InsecureChannelCredentials()));
    struct Case {
      int32_t node_rank;
      std::string group;
      std::string plan_key;
      std::string field;
    };
    const Case cases[] = {{1, "g", "", "plan_key"},   {1, "", "k", "group"},
                          {0, "g", "k", "node_rank"}, {3, "g", "k", "node_rank"},
                          {-1, "g", "k", "node_rank"}, {1, "g", "k", "recv_comm_id is 1024"}};
    const int aborts_before = nodes_[0].call_aborts;
    for (const Case& c : cases) {
      v1::AgreePlanRequest agree;
      agree.set_node_rank(c.node_rank);
      agree.set_group(c.group);
      agree.set_call_seq(9);
      agree.set_plan_key(c.plan_key);
      if (c.field == "recv_comm_id is 1024") agree.set_recv_comm_id(1024);
      v1::AgreePlanResponse agreed;
      grpc::ClientContext ctx1;
      const grpc::Status s1 = stub->AgreePlan(&ctx1, agree, &agreed);
      EXPECT_EQ(s1.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
      EXPECT_THAT(s1.error_message(), HasSubstr(c.field));
      // AbortCall carries no plan key or comm id.
      if (c.field == "plan_key" || c.field == "recv_comm_id is 1024") continue;
      v1::AbortCallRequest abort;
      abort.set_node_rank(c.node_rank);
      abort.set_group(c.group);
      abort.set_call_seq(9);
      v1::AbortCallResponse aborted;
      grpc::ClientContext ctx2;
      const grpc::Status s2 = stub->AbortCall(&ctx2, abort, &aborted);
      EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
      EXPECT_THAT(s2.error_message(), HasSubstr(c.field));
    }
    EXPECT_EQ(nodes_[0].call_aborts, aborts_before);  // nothing was aborted

    // Joins with garbage fields (UCX used to abort on these addresses) are
    // INVALID_ARGUMENT naming the field; the cluster stays formed.
    std::mt19937 rng(5);
    std::string random_64k(64 << 10, '\0');
    for (char& c : random_64k) c = static_cast<char>(rng());
    struct JoinCase {
      std::function<void(v1::JoinRequest&)> edit;
      std::string field;
    };
    const JoinCase joins[] = {
        {[](v1::JoinRequest& r) { r.set_ucx_worker_address(std::string(8, '\xff')); },
         "ucx_worker_address has format version 15"},
        {[&](v1::JoinRequest& r) { r.set_ucx_worker_address(random_64k); }, "ucx_worker_address has 65536 bytes"},
        {[](v1::JoinRequest& r) { r.set_ucx_worker_address(""); }, "ucx_worker_address is empty"},
        {[](v1::JoinRequest& r) { r.set_node_rank(7); }, "node_rank is 7 but num_nodes is 3"},
        {[](v1::JoinRequest& r) { r.set_num_nodes(-2); }, "num_nodes is -2"},
        {[](v1::JoinRequest& r) { r.set_devices_per_node(0); }, "devices_per_node is 0"},
        {[](v1::JoinRequest& r) { r.set_incarnation(0); }, "incarnation is 0"},
        {[](v1::JoinRequest& r) { r.set_version(std::string("v\0\x01", 3)); }, "version must be"},
    };
    for (const JoinCase& c : joins) {
      v1::JoinRequest join;
      join.set_node_rank(1);
      join.set_num_nodes(kNodes);
      join.set_devices_per_node(1);
      join.set_incarnation(nodes_[1].cluster->incarnation());
      join.set_ucx_worker_address(nodes_[1].worker->Address());
      join.set_version("test");
      c.edit(join);
      v1::JoinResponse joined;
      grpc::ClientContext ctx;
      const grpc::Status st = stub->Join(&ctx, join, &joined);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field << ": " << st.error_message();
      EXPECT_THAT(st.error_message(), HasSubstr(c.field));
    }
    EXPECT_TRUE(nodes_[0].cluster->formed());
  }

  // Node 2 goes away.
  const uint64_t epoch_before = nodes_[0].cluster->epoch();
  const int aborts_before = nodes_[0].node_aborts;
  const int port2 = nodes_[2].port;
  const absl::Time lost_at = absl::Now();
  Destroy(2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(Eventually(
        [&] { return nodes_[i].cluster->NodeStates()[2].state == NodeState::kDown; },
        absl::Seconds(6)))
        << "node " << i << " never saw node 2 DOWN";
    EXPECT_GT(nodes_[i].node_aborts, i == 0 ? aborts_before : 0);
    EXPECT_EQ(nodes_[i].last_aborted_node, 2);
    EXPECT_FALSE(nodes_[i].cluster->formed());
  }
  std::fprintf(stderr, "node 2 seen DOWN after %s\n",
               absl::FormatDuration(absl::Now() - lost_at).c_str());

  // It comes back on the same port with a new incarnation.
  Create(2, port2);
  ASSERT_EQ(nodes_[2].port, port2);
  StartAll({2});
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(Eventually([&] { return nodes_[i].cluster->formed(); }, absl::Seconds(5)))
        << "node " << i << " did not re-form";
  }
  EXPECT_GT(nodes_[0].cluster->epoch(), epoch_before);
  EXPECT_GT(nodes_[1].cluster->epoch(), 1u);
  ExpectUcxAllToAll(2);
}

TEST_F(ClusterTest, StartTimesOutNamingMissingNodes) {
  Create(0, 0);
  Create(1, 0);
  ClusterOptions o = Options(0);
  o.peers[2] = "127.0.0.1:1";  // nobody listens there
  o.join_timeout = absl::Milliseconds(500);
  const absl::Status s = nodes_[0].cluster->Start(o, nodes_[0].worker.get());
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("1 (127.0.0.1:"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 (127.0.0.1:1, JOINING)"));
}

// Before Start the service answers UNAVAILABLE (cluster.h); ProbeLink
// answered OK, unauthenticated (link_probe_fuzzer).
TEST_F(ClusterTest, PeerCallsBeforeStartAreUnavailable) {
  Create(0, 0);
  auto stub = v1::Peer::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", nodes_[0].port),
                                                    grpc::InsecureChannelCredentials()));
  auto context = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return c;
  };
  v1::ProbeLinkRequest probe;
  probe.set_payload(std::string(1024, 'p'));
  v1::ProbeLinkResponse probed;
  grpc::Status s = stub->ProbeLink(context().get(), probe, &probed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_address("127.0.0.1:9");
  v1::HeartbeatResponse alive;
  s = stub->Heartbeat(context().get(), heartbeat, &alive);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  // Once started it answers the probe.
  ClusterOptions o = Options(0);
  o.peers.clear();
  o.advertise_address = absl::StrCat("127.0.0.1:", nodes_[0].port);
  ASSERT_TRUE(nodes_[0].cluster->Start(o, nodes_[0].worker.get()).ok());
  s = stub->ProbeLink(context().get(), probe, &probed);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace hsap::cluster

// Issue 33 against real hsapd processes, without TLS (--insecure_peers on
// loopback): what a process that is not a member can no longer do to a
// group, and how fast (and by what name) a group's formation failures reach
// every rank.
//
//  * A spoofed JoinGroup claiming to be member B, with B's incarnation
//    (which B's Heartbeat hands to anyone) and another process's UCX
//    address: the root calls B back and refuses it (PERMISSION_DENIED); the
//    real group and the next clean groups of A and B are correct.
//  * AbortCall and AgreePlan from a non-member, or from a member's address
//    without the group's key: PERMISSION_DENIED naming the sender and the
//    group; a purely local (one-node) call under a stream of rogue aborts
//    finishes correct.
//  * Failures, timed on every rank: a member that names the root by
//    another address, a member with another member list, a member that
//    refuses the group (--max_peers), a member that never joins, an
//    unreachable member, an unreachable root. The figures are printed
//    (docs/reliability.md quotes them).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/transport/ucx_worker.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap::testing {
namespace {

using ::testing::HasSubstr;

// A daemon with a port of its own, its log kept.
struct Node {
  int port = 0;
  std::string log;
  std::unique_ptr<DaemonProcess> process;
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  std::string socket() const { return process->socket(); }
};

class PeerTrustTest : public ::testing::Test {
 protected:
  // Starts a daemon (1 CPU slot) with the common flags plus `extra`.
  Node* StartNode(std::vector<std::string> extra = {}) {
    auto n = std::make_unique<Node>();
    n->port = FreePort();
    n->log = absl::StrCat(logs_.path(), "/node", nodes_.size(), ".log");
    std::vector<std::string> flags = {"--devices=cpu:1", "--cpu_threads=1", "--ucx_transports=tcp",
                                      "--insecure_peers", "--heartbeat_ms=100",
                                      absl::StrCat("--port=", n->port)};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto p = DaemonProcess::Start(Runfile("server/hsapd"), flags, n->log);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    n->process = std::move(p).value();
    nodes_.push_back(std::move(n));
    return nodes_.back().get();
  }

  TempDir logs_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

std::unique_ptr<v1::Peer::Stub> PeerStub(const std::string& address) {
  return v1::Peer::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(5)) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return c;
}

// A one-rank-per-node group on `members` declared by its calls.
GroupSpec Declared(const std::string& name, const std::vector<Node*>& members) {
  GroupSpec spec;
  spec.group = name;
  spec.nodes = static_cast<int32_t>(members.size());
  spec.devices_per_node = 1;
  for (Node* n : members) {
    spec.sockets.push_back(n->socket());
    spec.member_addresses.push_back(n->address());
  }
  spec.strategy = hsap::v1::STRATEGY_SAP;
  spec.deadline_ms = 60000;
  return spec;
}

const std::vector<int64_t> kDocs = {0, 40, 41, 100, 128};

void ExpectCleanGroup(const std::string& name, const std::vector<Node*>& members, uint64_t seed) {
  auto r = RunGroup(MakeProblem(kDocs, true, seed), Declared(name, members));
  ASSERT_TRUE(r.ok()) << name << ": " << r.status();
  EXPECT_LT(r->max_error, 1e-4) << name;
}

// ---------------------------------------------------------------------------

TEST_F(PeerTrustTest, ASpoofedJoinGroupCannotTakeAMembersSlot) {
  Node* a = StartNode();
  Node* b = StartNode();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ExpectCleanGroup("G0", {a, b}, 1);

  // What an attacker on the network learns: B's incarnation from its
  // Heartbeat, and a UCX worker address of its own process.
  v1::HeartbeatRequest hello;
  hello.set_address("127.0.0.1:9");
  hello.set_incarnation(1);
  v1::HeartbeatResponse answer;
  ASSERT_TRUE(PeerStub(b->address())->Heartbeat(Context().get(), hello, &answer).ok());
  const uint64_t b_incarnation = answer.incarnation();
  ASSERT_NE(b_incarnation, 0u);
  auto worker = transport::UcxWorker::Create({.transports = "tcp"});
  ASSERT_TRUE(worker.ok()) << worker.status();

  // The real group G1; B's rank comes 1 s late, while the attacker keeps
  // claiming B's slot at the root.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<int, int> codes;  // attacker's answers by gRPC code
  int formed = 0;
  std::string denied_message, unavailable_message;
  std::thread attacker([&] {
    auto root = PeerStub(a->address());
    v1::JoinGroupRequest spoof;
    spoof.set_group("G1");
    spoof.add_nodes(a->address());
    spoof.add_nodes(b->address());
    spoof.set_node_index(1);
    spoof.set_address(b->address());
    spoof.set_incarnation(b_incarnation);
    spoof.set_ucx_worker_address((*worker)->Address());
    while (!stop) {
      v1::JoinGroupResponse response;
      const grpc::Status s = root->JoinGroup(Context().get(), spoof, &response);
      std::lock_guard<std::mutex> lock(mu);
      ++codes[s.error_code()];
      if (s.ok() && response.formed()) ++formed;
      if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) denied_message = s.error_message();
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) unavailable_message = s.error_message();
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  GroupSpec g1 = Declared("G1", {a, b});
  g1.edit_call_id = [](int32_t rank, hsap::v1::CallId*) {
    if (rank == 1) absl::SleepFor(absl::Seconds(1));
  };
  // While G1 is live: per-call requests from outside the group.
  std::vector<grpc::Status> outside;
  g1.while_open = [&] {
    auto root = PeerStub(a->address());
    v1::AbortCallRequest abort;
    abort.set_group("G1");
    abort.set_call_seq(3);
    abort.set_code(10);
    abort.set_message("rogue abort");
    abort.set_address("127.0.0.1:9");  // no member
    abort.set_incarnation(1);
    v1::AbortCallResponse none;
    outside.push_back(root->AbortCall(Context().get(), abort, &none));
    abort.set_address(b->address());  // a member's address and incarnation, no key
    abort.set_incarnation(b_incarnation);
    outside.push_back(root->AbortCall(Context().get(), abort, &none));
    v1::AgreePlanRequest agree;
    agree.set_group("G1");
    agree.set_call_seq(3);
    agree.set_plan_key("forged");
    agree.set_address(b->address());
    agree.set_incarnation(b_incarnation);
    v1::AgreePlanResponse agreed;
    outside.push_back(root->AgreePlan(Context().get(), agree, &agreed));
  };
  auto real = RunGroup(MakeProblem(kDocs, true, 2), g1);
  stop = true;
  attacker.join();
  ASSERT_TRUE(real.ok()) << real.status();
  EXPECT_LT(real->max_error, 1e-4);
  {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> seen;
    for (const auto& [code, n] : codes) seen.push_back(absl::StrCat("code ", code, " x", n));
    std::printf("the attacker's %s JoinGroups: %s; formed %d times\n", "spoofed",
                absl::StrJoin(seen, ", ").c_str(), formed);
    EXPECT_EQ(formed, 0);
    EXPECT_GT(codes[grpc::StatusCode::PERMISSION_DENIED], 0);
    EXPECT_THAT(denied_message, HasSubstr(absl::StrCat("claiming to be member ", b->address())));
    EXPECT_THAT(denied_message, HasSubstr("was not sent by it"));
    // OK is "ask again" (the root's ranks have not declared G1 yet, or
    // another confirmation is in flight). UNAVAILABLE only when the root
    // released G1 while it asked B about a spoofed join (the attacker goes on
    // until the real call has returned; seen once in CI under ASan).
    for (const auto& [code, n] : codes) {
      const bool released = code == grpc::StatusCode::UNAVAILABLE &&
                            absl::StrContains(unavailable_message, "was released on its root");
      EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::PERMISSION_DENIED ||
                  released)
          << "code " << code << (code == grpc::StatusCode::UNAVAILABLE ? ": " : "")
          << (code == grpc::StatusCode::UNAVAILABLE ? unavailable_message : "");
    }
  }
  ASSERT_EQ(outside.size(), 3u);
  for (const grpc::Status& s : outside) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("for group 'G1' refused"));
  }
  EXPECT_THAT(outside[0].error_message(), HasSubstr("127.0.0.1:9#1 is not a member of the group"));
  EXPECT_THAT(outside[1].error_message(), HasSubstr("does not carry the group's key"));
  EXPECT_THAT(outside[2].error_message(), HasSubstr("does not carry the group's key"));
  // The next clean groups of A and B (every later one failed until B
  // restarted, before).
  ExpectCleanGroup("G2", {a, b}, 3);
  ExpectCleanGroup("G3", {b, a}, 4);
  // The root's log names the refusal, and peers by address#incarnation.
  const std::string log = a->process->ReadLog();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("JoinGroup claiming to be member ", b->address(), "#",
                                          b_incarnation, " of group 'G1' refused")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("peer ", b->address(), "#", b_incarnation, " is UP")));
}

TEST_F(PeerTrustTest, ANonMemberAbortDoesNotEndALocalCall) {
  Node* d = StartNode({"--devices=cpu:2"});
  ASSERT_NE(d, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, denied{0};
  std::string message;
  std::thread rogue([&] {
    auto stub = PeerStub(d->address());
    while (!stop) {
      for (uint64_t seq : {1, 2}) {
        v1::AbortCallRequest abort;
        abort.set_group("local");
        abort.set_call_seq(seq);
        abort.set_code(13);
        abort.set_message("rogue abort");
        abort.set_address("127.0.0.1:9");
        abort.set_incarnation(1);
        v1::AbortCallResponse none;
        const grpc::Status s = stub->AbortCall(Context().get(), abort, &none);
        ++sent;
        if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          ++denied;
          if (message.empty()) message = s.error_message();
        }
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  // Two ranks of one node: a call of about a second each way on one thread.
  GroupSpec spec;
  spec.group = "local";
  spec.nodes = 1;
  spec.devices_per_node = 2;
  spec.sockets = {d->socket()};
  spec.deadline_ms = 60000;
  auto r = RunGroup(MakeProblem({0, 1500, 3072}, true, 5), spec);
  stop = true;
  rogue.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->max_error, 1e-4);
  std::printf("%d rogue AbortCalls during the call, %d PERMISSION_DENIED; the call took %.2f s "
              "forward, %.2f s backward\n",
              sent.load(), denied.load(), r->forward_seconds, r->backward_seconds);
  EXPECT_GT(sent.load(), 20);
  EXPECT_EQ(denied.load(), sent.load());
  EXPECT_THAT(message, HasSubstr("AbortCall from 127.0.0.1:9#1 for group 'local' refused"));
}

// ---------------------------------------------------------------------------
// Failures: every rank's time to error and its message.

struct Outcome {
  std::vector<absl::Status> statuses;
  std::vector<absl::Duration> durations;
};

Outcome RunFailing(GroupSpec spec, const std::string& label) {
  Outcome out;
  spec.statuses = &out.statuses;
  spec.durations = &out.durations;
  const absl::StatusOr<GroupResult> r = RunGroup(MakeProblem(kDocs, true, 7, false), spec);
  EXPECT_FALSE(r.ok()) << label << " succeeded";
  for (size_t i = 0; i < out.statuses.size(); ++i) {
    std::printf("%-28s rank %zu  %6.3f s  %s\n", label.c_str(), i,
                absl::ToDoubleSeconds(out.durations[i]), out.statuses[i].ToString().c_str());
  }
  return out;
}

TEST_F(PeerTrustTest, FormationFailuresReachEveryRankFastAndByName) {
  // Each failure reaches its ranks with its own code and message, well before
  // the calls' 60 s deadline. (Bounds of 2-3 s failed under ASan on a loaded
  // machine, at 2.4-2.7 s; the codes tell a refusal from the 2 s form
  // timeout.)
  const absl::Duration kPrompt = absl::Seconds(15);
  Node* a = StartNode({"--group_form_timeout_ms=2000"});
  Node* b = StartNode({"--group_form_timeout_ms=2000"});
  Node* c = StartNode({"--group_form_timeout_ms=2000"});
  Node* small = StartNode({"--group_form_timeout_ms=2000", "--max_peers=1"});
  ASSERT_TRUE(a != nullptr && b != nullptr && c != nullptr && small != nullptr);
  const std::string dead = absl::StrCat("127.0.0.1:", FreePort());  // nobody listens

  // 1. The member names the root by another spelling of its address.
  {
    GroupSpec spec = Declared("spelled", {a, b});
    const std::string other = absl::StrCat("localhost:", a->port);
    spec.edit_call_id = [&](int32_t rank, hsap::v1::CallId* id) {
      if (rank == 1) id->set_nodes(0, other);
    };
    Outcome o = RunFailing(spec, "root spelled differently");
    ASSERT_EQ(o.statuses.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(o.statuses[i].code(), absl::StatusCode::kFailedPrecondition) << o.statuses[i];
      EXPECT_LT(o.durations[i], kPrompt) << i;
      EXPECT_THAT(std::string(o.statuses[i].message()), HasSubstr(other)) << i;
      EXPECT_THAT(std::string(o.statuses[i].message()), HasSubstr(a->address())) << i;
    }
  }
  // 2. A member declares another member list.
  {
    GroupSpec spec = Declared("lists", {a, b, c});
    spec.edit_call_id = [&](int32_t rank, hsap::v1::CallId* id) {
      if (rank == 2) id->set_nodes(1, dead);
    };
    Outcome o = RunFailing(spec, "another member list");
    ASSERT_EQ(o.statuses.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(o.statuses[i].code(), absl::StatusCode::kFailedPrecondition) << o.statuses[i];
      EXPECT_LT(o.durations[i], kPrompt) << i;
      EXPECT_THAT(std::string(o.statuses[i].message()),
                  HasSubstr(absl::StrCat("member ", c->address())))
          << i;
      EXPECT_THAT(std::string(o.statuses[i].message()), HasSubstr(dead)) << i;
    }
  }
  // 3. A member refuses the group (it may reference one peer; the group
  // has two others).
  {
    Outcome o = RunFailing(Declared("refused", {a, b, small}), "a member refuses");
    ASSERT_EQ(o.statuses.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(o.statuses[i].code(), i == 2 ? absl::StatusCode::kResourceExhausted
                                             : absl::StatusCode::kFailedPrecondition)
          << o.statuses[i];
      EXPECT_LT(o.durations[i], kPrompt) << i;
      EXPECT_THAT(std::string(o.statuses[i].message()), HasSubstr("--max_peers")) << i;
      if (i < 2) {
        EXPECT_THAT(std::string(o.statuses[i].message()),
                    HasSubstr(absl::StrCat("member ", small->address())))
            << i;
      }
    }
  }
  // 4. A member never joins (its rank never calls): the root's ranks fail
  // at --group_form_timeout_ms, naming it.
  {
    GroupSpec spec = Declared("never", {a, b});
    spec.missing_rank = 1;
    Outcome o = RunFailing(spec, "member never joins");
    ASSERT_EQ(o.statuses.size(), 1u);
    EXPECT_EQ(o.statuses[0].code(), absl::StatusCode::kDeadlineExceeded) << o.statuses[0];
    EXPECT_GE(o.durations[0], absl::Milliseconds(1900));
    EXPECT_LT(o.durations[0], kPrompt);
    EXPECT_THAT(std::string(o.statuses[0].message()),
                HasSubstr(absl::StrCat("member node(s) 1 (", b->address())));
    EXPECT_THAT(std::string(o.statuses[0].message()), HasSubstr("within 2s (--group_form_timeout_ms)"));
  }
  // 5. A member is unreachable (nothing listens at its address).
  {
    GroupSpec spec = Declared("unreachable", {a, a});
    spec.member_addresses[1] = dead;
    spec.missing_rank = 1;
    Outcome o = RunFailing(spec, "member unreachable");
    ASSERT_EQ(o.statuses.size(), 1u);
    EXPECT_EQ(o.statuses[0].code(), absl::StatusCode::kDeadlineExceeded) << o.statuses[0];
    EXPECT_LT(o.durations[0], kPrompt);
    EXPECT_THAT(std::string(o.statuses[0].message()), HasSubstr(dead));
  }
  // 6. The root is unreachable.
  {
    GroupSpec spec = Declared("no-root", {b, b});
    spec.member_addresses[0] = dead;
    spec.missing_rank = 0;
    Outcome o = RunFailing(spec, "root unreachable");
    ASSERT_EQ(o.statuses.size(), 1u);
    EXPECT_EQ(o.statuses[0].code(), absl::StatusCode::kUnavailable) << o.statuses[0];
    EXPECT_LT(o.durations[0], kPrompt);
    EXPECT_THAT(std::string(o.statuses[0].message()), HasSubstr(dead));
  }
  // Afterwards the same daemons form clean groups.
  ExpectCleanGroup("after", {a, b, c}, 9);
}

}  // namespace
}  // namespace hsap::testing

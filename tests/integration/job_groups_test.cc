// Groups formed at run time by their members (CallId.nodes / node_index)
// on 3 daemons started with --port and no --peers (2 CPU device slots
// each): group A on nodes {0, 1} with 2 ranks per node, B on nodes {1, 2}
// with 1, C on node {2} alone run at the same time and each equals its
// float64 reference (each group's ranks are the sessions of a client
// process of its own: group_process.h); then node 0 is killed: A's calls end UNAVAILABLE or
// ABORTED within 2x their deadline while B and C keep succeeding (node 0 is
// outside their failure domain); node 0 restarted (a new incarnation, same
// port), A formed again under a new name succeeds. 200 groups created and
// finished leave every daemon's group and peer tables at their baseline.
// Nodes whose ranks declare different member lists never run; hsapd refuses
// bad advertised addresses.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "hsap/v1/cluster.pb.h"
#include "server/metrics/test_util.h"
#include "tests/integration/group_call.h"
#include "tests/integration/group_process.h"
#include "tests/integration/local_cluster.h"

namespace hsap::testing {
namespace {

const std::vector<std::string> kFlags = {"--cpu_threads=1", "--ucx_transports=tcp",
                                         "--heartbeat_ms=100", "--peer_down_ms=800",
                                         "--peer_linger_ms=300"};

std::vector<int64_t> Structure() { return {0, 5, 5, 90, 91, 150, 301}; }

// A group on `nodes` (indices of the LocalCluster) with `rpn` ranks on each.
GroupSpec Declared(LocalCluster& cluster, const std::string& name, std::vector<int> nodes,
                   int32_t rpn, hsap::v1::Strategy strategy) {
  GroupSpec spec;
  spec.group = name;
  spec.nodes = static_cast<int32_t>(nodes.size());
  spec.devices_per_node = rpn;
  const std::vector<std::string> sockets = cluster.sockets();
  for (int n : nodes) {
    spec.sockets.push_back(sockets[n]);
    spec.member_addresses.push_back(cluster.address(n));
  }
  spec.strategy = strategy;
  spec.deadline_ms = 20000;
  return spec;
}

struct GroupShape {
  const char* name;
  std::vector<int> nodes;
  int32_t rpn;
};

const GroupShape kA{"A", {0, 1}, 2}, kB{"B", {1, 2}, 1}, kC{"C", {2}, 2};

// The test the child processes of RunInChild run (below).
constexpr char kChildTest[] = "JobGroupsChild.RunsOneGroup";

// Runs `spec` on the problem (Structure(), causal, `seed`) in a client
// process of its own; a harness failure (the child crashed or hung) is the
// outer status.
absl::StatusOr<ChildGroupResult> RunInChild(uint64_t seed, const GroupSpec& spec) {
  return RunGroupInChild(Structure(), true, seed, spec, kChildTest,
                         absl::Milliseconds(2 * spec.deadline_ms) + absl::Seconds(30));
}

// Runs `shape` again and again under fresh names until `stop`, recording
// each run's outcome.
struct Loop {
  absl::Mutex mu;
  std::vector<absl::Status> statuses;
  std::vector<double> errors;
  std::vector<absl::Time> begins;
};

void RunLoop(LocalCluster& cluster, const GroupShape& shape, uint64_t seed,
             std::atomic<bool>* stop, Loop* out) {
  for (int i = 0; !stop->load(); ++i) {
    GroupSpec spec = Declared(cluster, absl::StrCat(shape.name, "-loop-", i), shape.nodes,
                              shape.rpn, hsap::v1::STRATEGY_SAP);
    const absl::Time begin = absl::Now();
    auto r = RunInChild(seed, spec);
    const absl::Status status = r.ok() ? r->status : r.status();
    absl::MutexLock lock(&out->mu);
    out->statuses.push_back(status);
    out->errors.push_back(status.ok() ? r->max_error : INFINITY);
    out->begins.push_back(begin);
  }
}

// Waits (bounded) until node i holds no group and no peer but itself: its
// baseline without --peers. Returns how long it took, or the last status.
absl::StatusOr<absl::Duration> WaitBaseline(LocalCluster& c, int i, absl::Duration limit) {
  const absl::Time start = absl::Now();
  std::string last;
  while (absl::Now() - start < limit) {
    auto s = c.Status(i);
    if (s.ok() && s->groups_size() == 0 && s->nodes_size() == 1 &&
        s->nodes(0).address() == c.address(i)) {
      return absl::Now() - start;
    }
    if (s.ok()) last = s->ShortDebugString();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("node ", i, " not at baseline: ", last));
}

TEST(JobGroupsTest, GroupsFormedAtRunTimeRunAtOnceAndFailApart) {
  auto cluster = LocalCluster::StartWithoutPeers(3, 2, kFlags);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitFormed(absl::Seconds(30)).ok());
  LocalCluster& c = **cluster;
  // Problem seeds of A, B and C (each child process makes its problem and
  // float64 reference).
  const uint64_t pa = 11, pb = 12, pc = 13;

  for (auto strategy : {hsap::v1::STRATEGY_SAP, hsap::v1::STRATEGY_HSAP, hsap::v1::STRATEGY_USP,
                        hsap::v1::STRATEGY_RING, hsap::v1::STRATEGY_AUTO}) {
    const std::string s = hsap::v1::Strategy_Name(strategy);
    SCOPED_TRACE(s);
    auto a = std::async(std::launch::async, [&] {
      return RunInChild(pa, Declared(c, "A-" + s, kA.nodes, kA.rpn, strategy));
    });
    auto b = std::async(std::launch::async, [&] {
      return RunInChild(pb, Declared(c, "B-" + s, kB.nodes, kB.rpn, strategy));
    });
    auto g = std::async(std::launch::async, [&] {
      return RunInChild(pc, Declared(c, "C-" + s, kC.nodes, kC.rpn, strategy));
    });
    auto ra = a.get(), rb = b.get(), rc = g.get();
    ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok()) << ra.status() << rb.status() << rc.status();
    ASSERT_TRUE(ra->status.ok()) << "A: " << ra->status;
    ASSERT_TRUE(rb->status.ok()) << "B: " << rb->status;
    ASSERT_TRUE(rc->status.ok()) << "C: " << rc->status;
    EXPECT_LE(ra->max_error, 1e-5);
    EXPECT_LE(rb->max_error, 1e-5);
    EXPECT_LE(rc->max_error, 1e-5);
    ASSERT_EQ(ra->strategies_run.size(), 4u);
    ASSERT_EQ(rb->strategies_run.size(), 2u);
    ASSERT_EQ(rc->strategies_run.size(), 2u);
    if (strategy != hsap::v1::STRATEGY_AUTO) {
      EXPECT_EQ(ra->strategies_run[0], strategy);
      EXPECT_EQ(rb->strategies_run[0], strategy);
    }
    // B's ranks are on two nodes: each one moved bytes to the other.
    EXPECT_GT(rb->bytes_received[0], 0u);
    EXPECT_GT(rb->bytes_received[1], 0u);
    std::printf("%s: A 2x2 on {0,1} %.3g, B 2x1 on {1,2} %.3g, C 1x2 on {2} %.3g (max rel error)\n",
                s.c_str(), ra->max_error, rb->max_error, rc->max_error);
  }

  // Node 0 dies while A is in flight (rank 1, on node 0, never submits, so
  // A cannot finish before the kill: ranks 2 and 3 wait on node 1 in the
  // plan agreement with node 0), and while B and C run in loops.
  GroupSpec doomed = Declared(c, "A-doomed", kA.nodes, kA.rpn, hsap::v1::STRATEGY_SAP);
  doomed.deadline_ms = 10000;
  doomed.missing_rank = 1;
  std::atomic<bool> stop{false};
  Loop loop_b, loop_c;
  std::thread tb([&] { RunLoop(c, kB, pb, &stop, &loop_b); });
  std::thread tc([&] { RunLoop(c, kC, pc, &stop, &loop_c); });
  auto a = std::async(std::launch::async, [&] { return RunInChild(pa, doomed); });
  absl::SleepFor(absl::Milliseconds(1500));
  const absl::Time killed = absl::Now();
  c.Kill(0);
  auto ra = a.get();
  const absl::Duration took = absl::Now() - killed;
  // B and C go on for a while after node 0 is known down (--peer_down_ms).
  auto runs_after = [&](Loop& l) {
    absl::MutexLock lock(&l.mu);
    int n = 0;
    for (size_t i = 0; i < l.begins.size(); ++i) n += l.begins[i] > killed + absl::Seconds(1);
    return n;
  };
  const absl::Time limit = absl::Now() + absl::Seconds(60);
  while ((runs_after(loop_b) < 2 || runs_after(loop_c) < 2) && absl::Now() < limit) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  stop = true;
  tb.join();
  tc.join();

  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_FALSE(ra->status.ok());
  const std::vector<absl::Status>& statuses = ra->callers;
  ASSERT_EQ(statuses.size(), 3u) << ra->status;
  for (size_t i = 0; i < statuses.size(); ++i) {
    const absl::Status& st = statuses[i];
    EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsAborted(st)) << "A's caller " << i << ": " << st;
    std::printf("killed node 0: A's caller %zu ended with %s\n", i, st.ToString().c_str());
  }
  // Ranks 2 and 3 (node 1) are told node 0 is gone, by its address.
  EXPECT_NE(statuses[1].message().find(c.address(0)), std::string::npos) << statuses[1];
  EXPECT_NE(statuses[2].message().find(c.address(0)), std::string::npos) << statuses[2];
  EXPECT_LT(took, absl::Milliseconds(2 * doomed.deadline_ms)) << took;
  std::printf("killed node 0: A's calls ended %s after the kill (deadline %u ms)\n",
              absl::FormatDuration(took).c_str(), doomed.deadline_ms);
  for (auto* l : {&loop_b, &loop_c}) {
    const char* name = l == &loop_b ? "B" : "C";
    absl::MutexLock lock(&l->mu);
    ASSERT_FALSE(l->statuses.empty());
    int before = 0;
    for (size_t i = 0; i < l->statuses.size(); ++i) {
      EXPECT_TRUE(l->statuses[i].ok()) << name << " run " << i << ": " << l->statuses[i];
      EXPECT_LE(l->errors[i], 1e-5) << name << " run " << i;
      before += l->begins[i] < killed;
    }
    EXPECT_GE(before, 1) << name << " never ran before the kill";
    std::printf("killed node 0: group %s ran %zu times OK, %d of them started before the kill\n",
                name, l->statuses.size(), before);
  }
  EXPECT_GE(runs_after(loop_b), 2);
  EXPECT_GE(runs_after(loop_c), 2);

  // Node 0 comes back (a new incarnation on the same port): A formed again
  // under a new name runs; node 1 connects to the new incarnation.
  ASSERT_TRUE(c.Restart(0).ok());
  auto again = RunInChild(pa, Declared(c, "A-again", kA.nodes, kA.rpn, hsap::v1::STRATEGY_HSAP));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->status.ok()) << again->status;
  EXPECT_LE(again->max_error, 1e-5);
  std::printf("node 0 restarted: A formed again as 'A-again', max rel error %.3g\n",
              again->max_error);
  // Every group has ended: the tables go back to their baseline.
  for (int i = 0; i < 3; ++i) {
    auto took = WaitBaseline(c, i, absl::Seconds(10));
    ASSERT_TRUE(took.ok()) << took.status();
  }
}

// 200 groups, each with its own sessions (closed at its end), on pairs of
// nodes, 4 at a time: afterwards each daemon's group and peer tables are
// back at their baseline (no group, no peer but itself) within the peer
// linger plus a bound, in GetClusterStatus and in /metrics (hsap_groups,
// hsap_peers), which showed the peers while the groups ran.
TEST(JobGroupsTest, TwoHundredGroupsLeaveTablesAtBaseline) {
  std::vector<int> metrics_ports;
  std::vector<std::vector<std::string>> node_flags;
  for (int i = 0; i < 3; ++i) {
    metrics_ports.push_back(FreePort());
    node_flags.push_back({absl::StrCat("--metrics_port=", metrics_ports.back())});
  }
  auto cluster = LocalCluster::StartWithoutPeers(3, 1, kFlags, node_flags);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  for (int i = 0; i < 3; ++i) {
    auto s = c.Status(i);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->self_address(), c.address(i));
    EXPECT_EQ(s->groups_size(), 0);
    ASSERT_EQ(s->nodes_size(), 1);
  }
  const GlobalProblem p = MakeProblem({0, 7, 20}, true, 31);
  const std::vector<std::vector<int>> pairs = {{0, 1}, {1, 2}, {2, 0}, {0, 2}};
  std::atomic<int> next{0}, ok{0};
  std::mutex errors_mu;
  std::vector<std::string> errors;
  const absl::Time start = absl::Now();
  std::vector<std::thread> streams;
  for (int t = 0; t < 4; ++t) {
    streams.emplace_back([&] {
      for (int g = next++; g < 200; g = next++) {
        GroupSpec spec = Declared(c, absl::StrCat("churn-", g), pairs[g % pairs.size()], 1,
                                  hsap::v1::STRATEGY_SAP);
        auto r = RunGroup(p, spec);
        if (r.ok() && r->max_error <= 1e-5) {
          ++ok;
        } else {
          std::lock_guard<std::mutex> lock(errors_mu);
          errors.push_back(r.ok() ? absl::StrCat("error ", r->max_error) : r.status().ToString());
        }
      }
    });
  }
  // While groups run, /metrics sees them (a poll of node 1, in every pair
  // but {2, 0}).
  double live_peak = 0;
  while (next.load() < 200) {
    live_peak = std::max(live_peak, metrics::testing::ScrapeSample(metrics_ports[1], "hsap_peers{state=\"UP\"}"));
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (auto& s : streams) s.join();
  const absl::Duration churn = absl::Now() - start;
  EXPECT_GE(live_peak, 1) << "node 1's /metrics never showed a run-time peer UP";
  std::printf("200 groups: node 1's /metrics showed up to %g run-time peers UP meanwhile\n",
              live_peak);
  EXPECT_EQ(ok.load(), 200) << (errors.empty() ? "" : errors[0]);
  for (int i = 0; i < 3; ++i) {
    auto took = WaitBaseline(c, i, absl::Seconds(5));
    ASSERT_TRUE(took.ok()) << took.status();
    std::printf("200 groups (%s): node %d back at baseline %s after the last\n",
                absl::FormatDuration(churn).c_str(), i, absl::FormatDuration(*took).c_str());
    // ... and so is /metrics (refreshed at each scrape).
    for (const char* state : {"FORMING", "UP", "FAILED"}) {
      EXPECT_EQ(metrics::testing::ScrapeSample(metrics_ports[i], absl::StrCat("hsap_groups{state=\"", state, "\"}")), 0)
          << "node " << i << " " << state;
    }
    for (const char* state : {"JOINING", "UP", "SUSPECT", "DOWN"}) {
      EXPECT_EQ(metrics::testing::ScrapeSample(metrics_ports[i], absl::StrCat("hsap_peers{state=\"", state, "\"}")), 0)
          << "node " << i << " " << state;
    }
    EXPECT_EQ(metrics::testing::ScrapeSample(metrics_ports[i], "hsap_limit{limit=\"max_peers\"}"), 1024);
  }
}

// Ranks on different nodes that name different member lists never run:
// each node's list is part of the key the members agree on.
TEST(JobGroupsTest, NodesThatDeclareDifferentMembersNeverRun) {
  auto cluster = LocalCluster::StartWithoutPeers(3, 1, kFlags);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const GlobalProblem p = MakeProblem(Structure(), true, 21);
  // Rank 1 calls node 2 and declares {0, 2}; rank 0 calls node 0 and
  // declares {0, 1}. Each list passes its own daemon's checks.
  GroupSpec spec = Declared(c, "split", {0, 2}, 1, hsap::v1::STRATEGY_SAP);
  spec.deadline_ms = 2000;
  const std::string node1 = c.address(1);
  spec.edit_call_id = [&](int32_t rank, hsap::v1::CallId* id) {
    if (rank == 0) id->set_nodes(1, node1);
  };
  std::vector<absl::Status> statuses;
  spec.statuses = &statuses;
  const absl::Time start = absl::Now();
  auto r = RunGroup(p, spec);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(r.ok());
  ASSERT_EQ(statuses.size(), 2u);
  // Node 2 joins the root, node 0, which holds another member list without
  // node 2: a non-member is refused (PERMISSION_DENIED), both lists named.
  const std::string list0 = absl::StrCat("[", c.address(0), ", ", c.address(1), "]");
  const std::string list2 = absl::StrCat("[", c.address(0), ", ", c.address(2), "]");
  EXPECT_TRUE(absl::IsPermissionDenied(statuses[1])) << statuses[1];
  EXPECT_NE(statuses[1].message().find("refused to form it"), std::string::npos) << statuses[1];
  EXPECT_NE(statuses[1].message().find(list0), std::string::npos) << statuses[1];
  EXPECT_NE(statuses[1].message().find(list2), std::string::npos) << statuses[1];
  // The root waits for node 1, which never hears of the group: the deadline,
  // naming it.
  EXPECT_TRUE(absl::IsDeadlineExceeded(statuses[0])) << statuses[0];
  EXPECT_NE(statuses[0].message().find(c.address(1)), std::string::npos) << statuses[0];
  EXPECT_LT(took, absl::Milliseconds(2 * spec.deadline_ms + 1000)) << took;
  std::printf("different member lists: rank 0 %s, rank 1 %s\n", statuses[0].ToString().c_str(),
              statuses[1].ToString().c_str());
}

// hsapd refuses advertised addresses and peer caps it cannot honour, naming
// the flag and the values.
TEST(JobGroupsTest, HsapdRefusesBadAdvertisedAddresses) {
  const int port = FreePort(), other = FreePort();
  const std::string self = absl::StrCat("127.0.0.1:", port);
  struct Case {
    std::string flags;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("--port=", port, " --peers=", self, ",127.0.0.1:", other,
                    " --node_rank=0 --advertise_address=localhost:", port),
       {absl::StrCat("--advertise_address is 'localhost:", port, "'"),
        absl::StrCat("--peers[0] (--node_rank) is '", self, "'")}},
      {absl::StrCat("--port=", port, " --advertise_address=nohost"),
       {"--advertise_address is 'nohost': has no host:port"}},
      {absl::StrCat("--port=", port, " --advertise_address=h:99999"),
       {"--advertise_address is 'h:99999': has a port outside 1..65535"}},
      {"--advertise_address=127.0.0.1:7000", {"--advertise_address is set but --port is 0"}},
      {absl::StrCat("--port=", port, " --max_peers=0"), {"max_peers is 0; it must be >= 1"}},
  };
  for (const Case& k : cases) {
    const HsapdExit run = RunHsapdUntilExit(k.flags);
    const std::string& text = run.output;
    const int status = run.status;
    ASSERT_TRUE(WIFEXITED(status)) << k.flags << "\n" << text;
    EXPECT_EQ(WEXITSTATUS(status), 1) << k.flags << "\n" << text;
    EXPECT_NE(text.find("hsapd failed to start"), std::string::npos) << text;
    for (const std::string& piece : k.pieces) {
      EXPECT_NE(text.find(piece), std::string::npos) << "missing: " << piece << "\n" << text;
    }
  }
}

// Not a test of its own: the body of the client processes RunInChild
// starts (this binary, filtered to this test, with the group's spec in the
// environment). Skipped in a normal run.
TEST(JobGroupsChild, RunsOneGroup) {
  if (std::getenv(kGroupChildSpecEnv) == nullptr) {
    GTEST_SKIP() << "runs only in the child processes of the tests above";
  }
  const absl::Status s = RunGroupChild();
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace hsap::testing

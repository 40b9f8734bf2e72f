// Two concurrent groups forced onto the same UCX communicator slot under
// the old scheme (comm id = FNV-1a(group, call_seq) % 1024, kept here only
// to pick the names) never exchange a byte across groups: on a 2 x 2
// loopback cluster (UCX over tcp), both groups run forward + backward at
// the same time with the same shapes, strategy and plan (so their exchange
// sequences line up message for message) and different random data, and
// each must equal its own float64 reference. Each node now draws its own
// receive id per call (server/transport/comm_ids.h), so the names' old
// hash no longer matters.
#include <future>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"

namespace hsap::testing {
namespace {

// The communicator id hsapd used to give a call (call_runner.cc before the
// per-receiver ids): FNV-1a over the group name and call_seq, mod 1024.
uint32_t OldHashedCommId(const std::string& group, uint64_t call_seq) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint8_t byte) { h = (h ^ byte) * 1099511628211ull; };
  for (char c : group) mix(static_cast<uint8_t>(c));
  for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(call_seq >> (8 * i)));
  return static_cast<uint32_t>(h % 1024);
}

// A second name whose old ids equal `first`'s at call_seq 1 (forward) and 2
// (backward): about 2^20 tries expected; the search is bounded.
std::string CollidingName(const std::string& first) {
  const uint32_t fwd = OldHashedCommId(first, 1), bwd = OldHashedCommId(first, 2);
  for (int i = 0; i < (1 << 25); ++i) {
    std::string name = absl::StrCat(first, "-twin", i);
    if (OldHashedCommId(name, 1) == fwd && OldHashedCommId(name, 2) == bwd) return name;
  }
  return "";
}

TEST(CommSlotCollision, OldHashCollidingGroupsRunConcurrentlyWithoutCrossing) {
  auto cluster = LocalCluster::Start(
      // No node is lost here: liveness generous enough for a loaded,
      // sanitized run (a missed 1 s heartbeat window under ASan on a busy
      // machine marked a node DOWN and failed the calls).
      2, 2,
      {"--cpu_threads=1", "--ucx_transports=tcp", "--heartbeat_ms=100", "--peer_down_ms=10000"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitFormed(absl::Seconds(30)).ok());
  const std::vector<int64_t> structure = {0, 7, 200, 201, 520, 768};
  int round = 0;
  for (auto strategy : {hsap::v1::STRATEGY_RING, hsap::v1::STRATEGY_SAP,
                        hsap::v1::STRATEGY_HSAP}) {
    const std::string a = absl::StrCat("collide", round);
    const std::string b = CollidingName(a);
    ASSERT_FALSE(b.empty()) << "no name found whose old comm ids equal " << a << "'s";
    ASSERT_EQ(OldHashedCommId(a, 1), OldHashedCommId(b, 1));
    ASSERT_EQ(OldHashedCommId(a, 2), OldHashedCommId(b, 2));
    SCOPED_TRACE(absl::StrCat(hsap::v1::Strategy_Name(strategy), ": groups ", a, " and ", b,
                              ", old comm ids ", OldHashedCommId(a, 1), " / ",
                              OldHashedCommId(a, 2)));
    // Same shapes (so the same plan), different data.
    const GlobalProblem pa = MakeProblem(structure, true, 100 + round);
    const GlobalProblem pb = MakeProblem(structure, true, 200 + round);
    ++round;
    GroupSpec spec;
    spec.nodes = 2;
    spec.devices_per_node = 2;
    spec.sockets = (*cluster)->sockets();
    spec.strategy = strategy;
    spec.assignment = hsap::v1::ASSIGNMENT_CONTIGUOUS;
    spec.deadline_ms = 20000;
    GroupSpec spec_a = spec, spec_b = spec;
    spec_a.group = a;
    spec_b.group = b;
    auto run_a = std::async(std::launch::async, [&] { return RunGroup(pa, spec_a); });
    auto run_b = std::async(std::launch::async, [&] { return RunGroup(pb, spec_b); });
    auto ra = run_a.get();
    auto rb = run_b.get();
    ASSERT_TRUE(ra.ok()) << a << ": " << ra.status();
    ASSERT_TRUE(rb.ok()) << b << ": " << rb.status();
    EXPECT_LE(ra->max_error, 1e-5) << a;
    EXPECT_LE(rb->max_error, 1e-5) << b;
    // The same plan moved the same bytes per rank, and some between nodes.
    EXPECT_EQ(ra->plan_key, rb->plan_key);
    EXPECT_EQ(ra->bytes_received, rb->bytes_received);
    EXPECT_EQ(ra->bwd_bytes_received, rb->bwd_bytes_received);
    uint64_t total = 0;
    for (uint64_t bytes : ra->bytes_received) total += bytes;
    EXPECT_GT(total, 0u);
    std::printf("%s: %s and %s (old comm ids %u/%u) concurrently: errors %.3g and %.3g\n",
                hsap::v1::Strategy_Name(strategy).c_str(), a.c_str(), b.c_str(),
                OldHashedCommId(a, 1), OldHashedCommId(a, 2), ra->max_error, rb->max_error);
  }
}

}  // namespace
}  // namespace hsap::testing

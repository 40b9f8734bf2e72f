// The measured cost profile (hsapd --profile=measured, the default) against
// real daemons: a static cluster's undeclared group and a group declared by
// its members both plan with their root's measurement on every node (the
// plan agreement, which compares plan keys, would refuse anything else),
// compute the reference results, and `hsapctl cluster` shows the profile in
// use, the compute rates measured and the links the root probed.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/plan/cost_model.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

std::string HsapctlCluster(const std::string& socket) {
  const std::string command = absl::StrCat(testing::Runfile("client/hsapctl"),
                                           " cluster --socket=", socket, " 2>&1");
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  pclose(pipe);
  return out;
}

testing::GlobalProblem Problem() {
  return testing::MakeProblem({0, 300, 700, 1024}, true, 7, true, 4, 2, 32);
}

TEST(MeasuredProfileTest, AStaticClusterPlansWithNodeZerosMeasurement) {
  auto cluster = testing::LocalCluster::Start(2, 2, {"--cpu_threads=2"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitFormed(absl::Seconds(30)).ok());
  const testing::GlobalProblem p = Problem();
  for (auto strategy : {hsap::v1::STRATEGY_AUTO, hsap::v1::STRATEGY_HSAP}) {
    testing::GroupSpec spec;
    spec.group = absl::StrCat("static-", static_cast<int>(strategy));
    spec.nodes = 2;
    spec.devices_per_node = 2;
    spec.sockets = (*cluster)->sockets();
    spec.strategy = strategy;
    auto r = testing::RunGroup(p, spec);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->max_error, 1e-5);
  }
  auto s0 = (*cluster)->Status(0);
  auto s1 = (*cluster)->Status(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  EXPECT_EQ(s0->profile(), "measured");
  // Both nodes hold the one profile node 0 settled for fp32, D = 32.
  ASSERT_EQ(s0->static_profiles_size(), 1);
  ASSERT_EQ(s1->static_profiles_size(), 1);
  EXPECT_EQ(s0->static_profiles(0), s1->static_profiles(0));
  EXPECT_THAT(s0->static_profiles(0), HasSubstr("float32/d32 custom:"));
  const std::string settled = s0->static_profiles(0).substr(s0->static_profiles(0).find(' ') + 1);
  auto parsed = plan::ParseHardwareProfile(settled);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // Node 0's own fp32/d32 rate, and its probe of node 1.
  ASSERT_GE(s0->measured_compute_size(), 1);
  EXPECT_EQ(parsed->attention_flops, s0->measured_compute(0).forward_flops());
  EXPECT_GT(parsed->attention_flops, 1e7);
  EXPECT_GT(s0->intra_bytes_per_s(), 1e8);
  double link = 0;
  for (const auto& n : s0->nodes()) {
    if (n.node_rank() == 1) link = n.link_bytes_per_s();
  }
  std::printf("node 0's probe of node 1 over loopback gRPC: %.3g B/s, latency %.3g s\n", link,
              parsed->inter_latency_s);
  EXPECT_GT(link, 1e6);  // loopback gRPC
  EXPECT_EQ(parsed->inter_bytes_per_s, link);
  for (const auto& n : s1->nodes()) EXPECT_EQ(n.link_bytes_per_s(), 0) << "node 1 probes nobody";
  const std::string table = HsapctlCluster((*cluster)->sockets()[0]);
  EXPECT_THAT(table, HasSubstr("cost profile: measured"));
  EXPECT_THAT(table, HasSubstr("float32 d32:"));
  EXPECT_THAT(table, HasSubstr("static cluster: float32/d32 custom:"));
  EXPECT_THAT(table, HasSubstr("B/s"));  // the LINK column of node 1
}

TEST(MeasuredProfileTest, AGroupDeclaredByItsMembersPlansWithItsRootsMeasurement) {
  auto cluster = testing::LocalCluster::StartWithoutPeers(3, 2, {"--cpu_threads=2"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const testing::GlobalProblem p = Problem();
  // Root node 2, member node 0: the member's own measurement differs from
  // the root's, and the group still agrees (and is exact).
  testing::GroupSpec spec;
  spec.group = "declared";
  spec.nodes = 2;
  spec.devices_per_node = 2;
  spec.sockets = {(*cluster)->sockets()[2], (*cluster)->sockets()[0]};
  spec.member_addresses = {(*cluster)->address(2), (*cluster)->address(0)};
  for (int call = 0; call < 2; ++call) {
    spec.first_call_seq = 1 + 2 * call;
    auto r = testing::RunGroup(p, spec);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->max_error, 1e-5);
  }
  auto root = (*cluster)->Status(2);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->profile(), "measured");
  ASSERT_GE(root->measured_compute_size(), 1);
  // A fixed profile is still taken as given, and a bad one is refused at start.
  auto bad = testing::LocalCluster::StartWithoutPeers(1, 1, {"--profile=custom:flops=0"});
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace hsap

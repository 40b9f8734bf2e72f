// The viewer's figures agree with the plan: received bytes by tier equal
// RankStats' (every strategy), traffic matrices sum to them, the stage
// timeline sums to the modeled times (also with shared inter-node links),
// the inter-node exact need is what hsap moves across nodes, and page rows
// aggregate to nodes above 64 ranks.
#include "server/viewer/plan_figures.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/plan/compiler.h"
#include "server/plan/cost_model.h"

namespace hsap::viewer {
namespace {

using plan::Plan;
using plan::Strategy;

plan::PlanSpec Spec(int32_t nodes, int32_t dpn, Strategy strategy,
                    std::vector<int64_t> cu = {0, 700, 1000, 1900, 2000, 3100, 4096}) {
  plan::PlanSpec spec;
  spec.cu_seqlens = std::move(cu);
  spec.total_tokens = spec.cu_seqlens.back();
  spec.topology = {nodes, dpn};
  spec.shape = {.num_heads_q = 8, .num_heads_kv = 4, .head_dim = 64, .dtype = DType::kBFloat16};
  spec.strategy = strategy;
  spec.profile = "h100";
  return spec;
}

Plan Compile(const plan::PlanSpec& spec) {
  absl::StatusOr<Plan> p = plan::CompilePlan(spec);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *std::move(p) : Plan();
}

void ExpectNear(double a, double b, const std::string& what) {
  EXPECT_NEAR(a, b, 1e-9 * std::max(1.0, std::abs(b))) << what;
}

class EveryStrategy : public ::testing::TestWithParam<Strategy> {};

TEST_P(EveryStrategy, TiersTrafficAndTimelineMatchTheStatistics) {
  for (const auto& [nodes, dpn] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {3, 2}}) {
    const Plan p = Compile(Spec(nodes, dpn, GetParam()));
    ASSERT_EQ(p.ranks.size(), static_cast<size_t>(nodes * dpn));
    const std::string where = absl::StrCat(plan::StrategyName(p.strategy), " ", nodes, "x", dpn);

    const std::vector<TierSplit> tiers = ReceivedBytesByTier(p);
    const TrafficMatrix ranks = RankTraffic(p);
    const TrafficMatrix nodes_m = NodeTraffic(p);
    int64_t node_total = 0;
    for (int64_t v : nodes_m.fwd) node_total += v;
    int64_t total = 0;
    for (size_t r = 0; r < p.ranks.size(); ++r) {
      const plan::RankStats& s = p.ranks[r].stats;
      EXPECT_EQ(tiers[r].fwd, s.fwd_recv_bytes) << where << " rank " << r;
      EXPECT_EQ(tiers[r].bwd, s.bwd_recv_bytes) << where << " rank " << r;
      int64_t into = 0, into_bwd = 0;
      for (size_t src = 0; src < p.ranks.size(); ++src) {
        into += ranks.fwd[src * ranks.size + r];
        into_bwd += ranks.bwd[src * ranks.size + r];
      }
      EXPECT_EQ(into, s.FwdRecvBytes()) << where << " rank " << r;
      EXPECT_EQ(into_bwd, s.BwdRecvBytes()) << where << " rank " << r;
      EXPECT_EQ(ranks.fwd[r * ranks.size + r], 0) << where << ": nothing is sent to oneself";
      total += s.FwdRecvBytes();
    }
    EXPECT_EQ(total, p.stats.total_fwd_bytes) << where;
    EXPECT_EQ(node_total, total) << where;
    // The page's inter-node figures are the plan's statistics.
    int64_t inter_total = 0, inter_max = 0, need_total = 0, need_max = 0;
    for (const TierSplit& t : tiers) {
      inter_total += t.fwd[1];
      inter_max = std::max(inter_max, t.fwd[1]);
    }
    for (int64_t b : InterNodeExactNeedBytes(p)) {
      need_total += b;
      need_max = std::max(need_max, b);
    }
    EXPECT_EQ(inter_total, p.stats.total_fwd_bytes_by_tier[1]) << where;
    EXPECT_EQ(inter_max, p.stats.max_fwd_inter_recv_bytes) << where;
    EXPECT_EQ(need_total, p.stats.inter_node_need_bytes) << where;
    EXPECT_EQ(need_max, p.stats.max_node_inter_need_bytes) << where;
    // Node diagonal: the intra-node bytes.
    int64_t diagonal = 0;
    for (int n = 0; n < nodes; ++n) diagonal += nodes_m.fwd[n * nodes + n];
    EXPECT_EQ(diagonal, p.stats.total_fwd_bytes_by_tier[0]) << where;

    absl::StatusOr<Timeline> tl = ModelTimeline(p);
    ASSERT_TRUE(tl.ok()) << tl.status();
    for (size_t r = 0; r < p.ranks.size(); ++r) {
      double fwd = 0, bwd = 0, compute = 0;
      for (const StageTime& t : tl->fwd[r]) {
        fwd += t.total_us();
        compute += t.overlap_us + t.compute_us;
      }
      for (const StageTime& t : tl->bwd[r]) bwd += t.total_us();
      ExpectNear(fwd, p.ranks[r].stats.fwd_us, where + " fwd_us");
      ExpectNear(bwd, p.ranks[r].stats.bwd_us, where + " bwd_us");
      ExpectNear(compute, p.ranks[r].stats.fwd_compute_us, where + " fwd_compute_us");
    }
    ExpectNear(std::accumulate(tl->fwd_stage_us.begin(), tl->fwd_stage_us.end(), 0.0),
               p.stats.fwd_us, where + " plan fwd_us");
    ExpectNear(std::accumulate(tl->bwd_stage_us.begin(), tl->bwd_stage_us.end(), 0.0),
               p.stats.bwd_us, where + " plan bwd_us");
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, EveryStrategy,
                         ::testing::Values(Strategy::kRing, Strategy::kAllGather,
                                           Strategy::kUlysses, Strategy::kUsp, Strategy::kSap,
                                           Strategy::kHsap, Strategy::kAuto),
                         [](const auto& info) { return std::string(plan::StrategyName(info.param)); });

TEST(TimelineTest, SharedInterNodeLinksAreModeledAsTheCompilerDoes) {
  plan::PlanSpec spec = Spec(2, 4, Strategy::kSap);
  spec.profile =
      "custom:flops=6.2e9,inter_bytes_per_s=7.1e5,intra_bytes_per_s=2e9,inter_latency_us=250,"
      "intra_latency_us=30,inter_link_ranks=2";
  const Plan p = Compile(spec);
  absl::StatusOr<Timeline> tl = ModelTimeline(p);
  ASSERT_TRUE(tl.ok()) << tl.status();
  for (size_t r = 0; r < p.ranks.size(); ++r) {
    double fwd = 0;
    for (const StageTime& t : tl->fwd[r]) fwd += t.total_us();
    ExpectNear(fwd, p.ranks[r].stats.fwd_us, absl::StrCat("rank ", r));
  }
  ExpectNear(std::accumulate(tl->bwd_stage_us.begin(), tl->bwd_stage_us.end(), 0.0),
             p.stats.bwd_us, "bwd");
}

TEST(TimelineTest, AnUnknownProfileIsAnError) {
  Plan p = Compile(Spec(1, 2, Strategy::kSap));
  p.spec.profile = "no-such-profile";
  EXPECT_EQ(ModelTimeline(p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InterNodeNeedTest, OneRankPerNodeIsTheRanksExactNeed) {
  const Plan p = Compile(Spec(4, 1, Strategy::kSap));
  const std::vector<int64_t> need = InterNodeExactNeedBytes(p);
  ASSERT_EQ(need.size(), 4u);
  for (int n = 0; n < 4; ++n) EXPECT_EQ(need[n], p.ranks[n].stats.exact_need_bytes) << n;
}

TEST(InterNodeNeedTest, HsapMovesExactlyTheInterNodeNeedAcrossNodes) {
  // Documents that cross nodes: 2 nodes x 2 ranks, contiguous assignment.
  plan::PlanSpec spec = Spec(2, 2, Strategy::kHsap, {0, 1500, 2600, 4096});
  spec.assignment = plan::AssignmentPolicy::kContiguous;
  const Plan p = Compile(spec);
  ASSERT_EQ(p.strategy, Strategy::kHsap);
  const std::vector<int64_t> need = InterNodeExactNeedBytes(p);
  const std::vector<TierSplit> tiers = ReceivedBytesByTier(p);
  for (int n = 0; n < 2; ++n) {
    int64_t inter = 0;
    for (int r = 2 * n; r < 2 * n + 2; ++r) inter += tiers[r].fwd[1];
    EXPECT_EQ(inter, need[n]) << "node " << n;
  }
  EXPECT_EQ(need[0], 0) << "node 0's documents start on it";
  // Node 1 holds [2048, 4096): its queries of document [1500, 2600) see
  // keys [1500, 2048), held by node 0.
  EXPECT_EQ(need[1], (2048 - 1500) * plan::KvRowBytes(spec.shape, spec.shape.num_heads_kv));
  const Floors f = ComputeFloors(p);
  const double node_bw = plan::GetHardwareProfile("h100").inter_bytes_per_s * 2;
  EXPECT_NEAR(f.inter_need_us, need[1] / node_bw * 1e6, 1e-9);
}

TEST(PageRowsTest, RanksUpTo64ThenNodesThenRunsOfNodes) {
  Rows r = PageRows({8, 8});
  EXPECT_EQ(r.level, RowLevel::kRank);
  EXPECT_EQ(r.rows.size(), 64u);
  EXPECT_EQ(r.rows[63].label, "rank 63");
  r = PageRows({64, 8});
  EXPECT_EQ(r.level, RowLevel::kNode);
  ASSERT_EQ(r.rows.size(), 64u);
  EXPECT_EQ(r.rows[5].first_rank, 40);
  EXPECT_EQ(r.rows[5].last_rank, 47);
  EXPECT_EQ(r.rows[5].label, "node 5");
  r = PageRows({130, 1});
  EXPECT_EQ(r.level, RowLevel::kNodeRun);
  ASSERT_EQ(r.rows.size(), 44u);  // runs of 3 nodes
  EXPECT_EQ(r.rows.back().first_node, 129);
  EXPECT_EQ(r.rows.back().last_node, 129);
  EXPECT_EQ(r.rows[1].label, "nodes 3-5");
}

TEST(BinTimelineTest, BinsSumTheirStagesAndKeepTheTotal) {
  const Plan p = Compile(Spec(1, 8, Strategy::kRing));
  absl::StatusOr<Timeline> tl = ModelTimeline(p);
  ASSERT_TRUE(tl.ok());
  ASSERT_EQ(tl->fwd_stage_us.size(), 7u);
  const Rows rows = PageRows(p.spec.topology);
  const BinnedTimeline b = BinTimeline(tl->fwd, tl->fwd_stage_us, rows, 3);
  EXPECT_EQ(b.stages_per_bin, 3);
  ASSERT_EQ(b.bin_us.size(), 3u);
  ExpectNear(b.bin_us[0] + b.bin_us[1] + b.bin_us[2], p.stats.fwd_us, "total");
  ExpectNear(b.bin_start_us[2], tl->fwd_stage_us[0] + tl->fwd_stage_us[1] +
                                    tl->fwd_stage_us[2] + tl->fwd_stage_us[3] +
                                    tl->fwd_stage_us[4] + tl->fwd_stage_us[5],
             "start of the third bin");
  double transfer = 0;
  for (int s = 6; s < 7; ++s) transfer += tl->fwd[2][s].transfer_us;
  ExpectNear(b.cells[2][2][0], transfer, "rank 2's last bin");
}

}  // namespace
}  // namespace hsap::viewer

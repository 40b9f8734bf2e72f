// The scale simulator on tiny cases: closed-form bytes equal the compiled
// plans', full-plan rows equal direct compiles, bound rows are lower bounds
// of them, the floors hold, and the TSV is deterministic.
#include "bench/scale_sim/sim.h"

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "common/workload.h"
#include "gtest/gtest.h"
#include "server/plan/compiler.h"

namespace hsap::bench {
namespace {

using plan::Strategy;

std::vector<int64_t> Lengths() {
  auto l = LoadDocumentLengths(FindWorkload());
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : std::vector<int64_t>{1000, 3000, 500};
}

plan::PlanSpec Spec(const std::vector<int64_t>& cu, int32_t nodes, int32_t dev,
                    plan::HeadShape shape, Strategy s) {
  plan::PlanSpec spec;
  spec.cu_seqlens = cu;
  spec.total_tokens = cu.back();
  spec.topology = {nodes, dev};
  spec.shape = shape;
  spec.strategy = s;
  return spec;
}

constexpr Strategy kBaselines[] = {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses,
                                   Strategy::kUsp};

TEST(ScaleSimTest, ClosedFormBytesEqualCompiledPlans) {
  const auto packs = PackDocuments(Lengths(), 6144, 2, 7);
  const plan::HeadShape shapes[] = {{8, 2, 64, DType::kBFloat16},
                                    {4, 4, 32, DType::kFloat32},
                                    {6, 2, 16, DType::kFloat16},
                                    {2, 1, 16, DType::kBFloat16}};  // fewer heads than slots
  const std::pair<int32_t, int32_t> topologies[] = {{1, 4}, {2, 2}, {2, 4}, {4, 2}, {3, 1}};
  for (const auto& cu : packs) {
    for (const plan::HeadShape& shape : shapes) {
      for (const auto& [nodes, dev] : topologies) {
        auto sap = plan::CompilePlan(Spec(cu, nodes, dev, shape, Strategy::kSap));
        ASSERT_TRUE(sap.ok()) << sap.status();
        EXPECT_EQ(ClosedFormBusiestBytes(Strategy::kSap, *sap), -1);
        for (Strategy s : kBaselines) {
          auto p = plan::CompilePlan(Spec(cu, nodes, dev, shape, s));
          ASSERT_TRUE(p.ok()) << p.status();
          EXPECT_EQ(ClosedFormBusiestBytes(s, *sap), p->stats.max_fwd_recv_bytes)
              << plan::StrategyName(s) << " " << nodes << "x" << dev << " Hq "
              << shape.num_heads_q << " Hkv " << shape.num_heads_kv;
        }
      }
    }
  }
}

SimOptions Options() {
  SimOptions o;
  o.shape = {8, 2, 32, DType::kBFloat16};
  o.profile = "h100";
  o.packs = 2;
  o.strategies = {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                  Strategy::kSap,  Strategy::kHsap,      Strategy::kAuto};
  return o;
}

TEST(ScaleSimTest, FullRowsEqualCompilesAndBoundsAreBelow) {
  const std::vector<int64_t> lengths = Lengths();
  const int64_t T = 8192;
  SimOptions o = Options();
  auto full = SimulatePoint(lengths, T, 2, 4, o);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->rows.size(), o.strategies.size());
  const auto packs = PackDocuments(lengths, T, o.packs, o.seed);
  double best = 1e300;
  for (const StrategyRow& row : full->rows) {
    EXPECT_EQ(row.source, Source::kPlan);
    double modeled = 0;
    int64_t bytes = 0, inter = 0;
    for (const auto& cu : packs) {
      auto p = plan::CompilePlan(Spec(cu, 2, 4, o.shape, row.strategy));
      ASSERT_TRUE(p.ok()) << p.status();
      modeled += p->stats.modeled_us;
      bytes += p->stats.max_fwd_recv_bytes;
      inter += p->stats.max_fwd_inter_recv_bytes;
    }
    EXPECT_DOUBLE_EQ(row.modeled_us, modeled) << plan::StrategyName(row.strategy);
    EXPECT_EQ(row.busiest_fwd_recv_bytes, bytes) << plan::StrategyName(row.strategy);
    EXPECT_EQ(row.busiest_inter_fwd_recv_bytes, inter) << plan::StrategyName(row.strategy);
    // No strategy's busiest rank moves less across nodes than the busiest
    // node's inter-node need per link (hsap: exactly that, Hkv 2 over 4 slots
    // shares KV heads, so at least).
    if (row.strategy != Strategy::kUlysses) {  // ulysses moves queries across nodes instead
      EXPECT_GE(row.busiest_inter_fwd_recv_bytes, full->floors.inter_need_bytes)
          << plan::StrategyName(row.strategy);
    }
    EXPECT_GE(row.modeled_us, full->floors.compute_us) << plan::StrategyName(row.strategy);
    if (row.strategy != Strategy::kAuto) best = std::min(best, row.modeled_us);
    // sap receives exactly the exact need.
    if (row.strategy == Strategy::kSap) {
      EXPECT_EQ(row.busiest_fwd_recv_bytes, full->floors.exact_need_bytes);
    }
  }
  // auto per pack is the best per pack, so its sum is at most the best sum.
  EXPECT_LE(full->rows.back().modeled_us, best * (1 + 1e-12));

  for (Strategy s : kBaselines) o.max_full_ranks[s] = 4;  // 8 ranks: bounds
  o.max_full_ranks[Strategy::kSap] = 4;
  auto bound = SimulatePoint(lengths, T, 2, 4, o);
  ASSERT_TRUE(bound.ok()) << bound.status();
  for (size_t i = 0; i < o.strategies.size(); ++i) {
    const StrategyRow& b = bound->rows[i];
    const StrategyRow& f = full->rows[i];
    const bool capped = o.max_full_ranks.count(b.strategy) > 0;
    EXPECT_EQ(b.source, capped ? Source::kBound : Source::kPlan) << plan::StrategyName(b.strategy);
    EXPECT_LE(b.modeled_us, f.modeled_us * (1 + 1e-9)) << plan::StrategyName(b.strategy);
    EXPECT_GT(b.modeled_us, 0) << plan::StrategyName(b.strategy);
    // The closed forms (sap: its exact need) give the plans' bytes.
    EXPECT_EQ(b.busiest_fwd_recv_bytes, f.busiest_fwd_recv_bytes) << plan::StrategyName(b.strategy);
  }
}

TEST(ScaleSimTest, TableAndTsvAreDeterministic) {
  SimOptions o = Options();
  auto a = SimulatePoint(Lengths(), 4096, 2, 2, o);
  auto b = SimulatePoint(Lengths(), 4096, 2, 2, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(PointTsv(*a), PointTsv(*b));
  const std::vector<std::string> lines = absl::StrSplit(PointTsv(*a), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), o.strategies.size() + 3);  // + the three floors
  const size_t columns = std::vector<std::string>(absl::StrSplit(TsvHeader(), '\t')).size();
  for (const std::string& line : lines) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(line, '\t')).size(), columns) << line;
  }
  EXPECT_TRUE(absl::StartsWith(lines[0], "4096\t2\t4\tring\tring\tplan\t")) << lines[0];
  const std::string table = FormatPointTable(*a);
  EXPECT_NE(table.find("T = 4096, 2 nodes x 2 = 4 GPUs, 2 packs"), std::string::npos) << table;
  EXPECT_NE(table.find("floors: compute"), std::string::npos) << table;

  o.profile = "custom:flops=1e12";
  auto bad = SimulatePoint(Lengths(), 4096, 2, 2, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hsap::bench

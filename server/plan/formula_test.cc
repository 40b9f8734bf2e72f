// Bytes of ring, allgather and ulysses against the published formulas
// (DESIGN.md §8), and sap's backward volume.
#include "gtest/gtest.h"
#include "server/plan/compiler.h"
#include "server/plan/plan_checker.h"

namespace hsap::plan {
namespace {

PlanSpec Spec(Strategy s, int nodes, int devices, int64_t T, int hq, int hkv) {
  PlanSpec spec;
  spec.cu_seqlens = {0, T / 3, T / 2, T};
  spec.total_tokens = T;
  spec.topology = {nodes, devices};
  spec.shape = {hq, hkv, 64, DType::kBFloat16};
  spec.strategy = s;
  spec.assignment = AssignmentPolicy::kContiguous;
  return spec;
}

TEST(FormulaTest, RingAndAllGatherReceiveEveryOtherRanksKv) {
  for (Strategy s : {Strategy::kRing, Strategy::kAllGather}) {
    for (auto [nodes, dev] : {std::pair{1, 8}, {2, 4}, {4, 8}}) {
      const int P = nodes * dev;
      const int64_t T = 64 * P;
      PlanSpec spec = Spec(s, nodes, dev, T, 16, 4);
      auto plan = CompilePlan(spec);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t kappa = 2 * 4 * 64 * 2;
      for (const RankPlan& rp : plan->ranks) {
        // (P - 1) / P * T * kappa per rank and layer, forward.
        EXPECT_EQ(rp.stats.FwdRecvBytes(), (P - 1) * T / P * kappa)
            << StrategyName(s) << " rank " << rp.rank;
        EXPECT_EQ(rp.stats.FwdSendBytes(), (P - 1) * T / P * kappa);
        // Backward: the K/V again plus the dK/dV partials of every other
        // rank, in fp32: twice the bf16 bytes.
        EXPECT_EQ(rp.stats.BwdRecvBytes(), (P - 1) * T / P * kappa * (1 + 2));
      }
    }
  }
}

TEST(FormulaTest, RingHasOneRoundPerPeer) {
  PlanSpec spec = Spec(Strategy::kRing, 1, 8, 512, 8, 8);
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stats.num_fwd_stages, 7);
  for (const RankPlan& rp : plan->ranks) {
    for (int k = 1; k < 8; ++k) {
      ASSERT_EQ(rp.forward[k - 1].recvs.size(), 1u);
      EXPECT_EQ(rp.forward[k - 1].recvs[0].peer, (rp.rank - k + 8) % 8);
    }
  }
}

TEST(FormulaTest, UlyssesAllToAll) {
  for (auto [nodes, dev, hq, hkv] : {std::tuple{1, 8, 32, 8}, {2, 4, 16, 8}, {1, 4, 8, 4}}) {
    const int P = nodes * dev;
    const int64_t T = 32 * P;
    PlanSpec spec = Spec(Strategy::kUlysses, nodes, dev, T, hq, hkv);
    auto plan = CompilePlan(spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t D = 64, b = 2;
    // (P - 1) / P * (T / P) * 2 (Hq + Hkv) * D * bytes, plus the fp32 LSE
    // that travels back with O: (P - 1) / P * (T / P) * Hq * 4.
    const int64_t formula = (P - 1) * (T / P) * 2 * (hq + hkv) * D * b / P;
    const int64_t lse = (P - 1) * (T / P) * hq * 4 / P;
    for (const RankPlan& rp : plan->ranks) {
      EXPECT_EQ(rp.stats.FwdRecvBytes(), formula + lse) << "rank " << rp.rank;
      EXPECT_EQ(rp.stats.FwdSendBytes(), formula + lse) << "rank " << rp.rank;
      EXPECT_EQ(rp.q_head_end - rp.q_head_begin, hq / P);
    }
    EXPECT_TRUE(CheckTransfers(*plan).ok());
  }
}

TEST(FormulaTest, UnevenHeadsSplitWithIdleSlots) {
  // 5 query heads on 8 devices: slots of 0 or 1 head; every pair still
  // computed once per head.
  PlanSpec spec = Spec(Strategy::kUlysses, 1, 8, 40, 5, 5);
  spec.shape.head_dim = 8;
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int idle = 0, heads = 0;
  for (const RankPlan& rp : plan->ranks) {
    const int h = rp.q_head_end - rp.q_head_begin;
    EXPECT_LE(h, 1);
    idle += h == 0;
    heads += h;
    if (h == 0) {
      EXPECT_EQ(rp.stats.area, 0);
    }
  }
  EXPECT_EQ(idle, 3);
  EXPECT_EQ(heads, 5);
  EXPECT_TRUE(CheckCoverage(*plan).ok()) << CheckCoverage(*plan);
  EXPECT_TRUE(CheckTransfers(*plan).ok()) << CheckTransfers(*plan);
  // GQA with fewer kv heads than slots: kv heads are replicated.
  spec.shape.num_heads_q = 4;
  spec.shape.num_heads_kv = 2;
  spec.strategy = Strategy::kHsap;
  spec.topology = {2, 4};
  plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  for (const RankPlan& rp : plan->ranks) {
    EXPECT_EQ(rp.q_head_end - rp.q_head_begin, 1);
    EXPECT_EQ(rp.kv_head_begin, rp.q_head_begin / 2);
    EXPECT_EQ(rp.kv_head_end - rp.kv_head_begin, 1);
  }
  EXPECT_TRUE(CheckCoverage(*plan).ok()) << CheckCoverage(*plan);
}

TEST(FormulaTest, SapOnOneCausalDocumentReceivesThePrefix) {
  // One causal document of 16 tokens over 4 ranks, contiguous: rank r needs
  // the 4r tokens before its own, once.
  PlanSpec spec = Spec(Strategy::kSap, 1, 4, 16, 2, 1);
  spec.cu_seqlens = {0, 16};
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  const int64_t kappa = 2 * 1 * 64 * 2;
  for (const RankPlan& rp : plan->ranks) {
    EXPECT_EQ(rp.stats.FwdRecvBytes(), 4 * rp.rank * kappa);
    EXPECT_EQ(rp.stats.FwdSendBytes(), 4 * (3 - rp.rank) * kappa);
    EXPECT_EQ(rp.stats.area, 4 * rp.rank * 4 + 10);
  }
  // Packed short documents that never cross a rank boundary: nothing moves.
  spec.cu_seqlens = {0, 4, 8, 12, 16};
  plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->stats.total_fwd_bytes, 0);
}

}  // namespace
}  // namespace hsap::plan

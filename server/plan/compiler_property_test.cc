// Property tests of the plan compiler over random document structures,
// against brute-force references (plan_checker.h): exact-once coverage,
// matching transfers, budgets, exact-need receive bytes for sap and hsap.
#include <random>

#include "gtest/gtest.h"
#include "server/plan/compiler.h"
#include "server/plan/cost_model.h"
#include "server/plan/plan_checker.h"
#include "server/plan/plan_proto.h"
#include "tests/sanitizers/sweep.h"

namespace hsap::plan {
namespace {

// A random packed structure: zero-length and one-token documents, lengths
// not divisible by P, sometimes one document spanning everything, sometimes
// mask slices with shared prefixes.
PlanSpec RandomSpec(std::mt19937_64& rng, int case_index) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  PlanSpec spec;
  const int nodes = static_cast<int>(uni(1, 8));
  const int64_t max_dev = std::max<int64_t>(1, 64 / nodes);
  spec.topology = {nodes, static_cast<int32_t>(uni(1, std::min<int64_t>(8, max_dev)))};
  if (case_index % 10 == 0) spec.topology = {static_cast<int32_t>(uni(1, 8)), 8};  // up to 64
  const int32_t P = spec.topology.num_ranks();
  const int64_t T = uni(0, 4) == 0 ? uni(0, P + 3) : uni(P, 96);
  spec.total_tokens = T;
  const int kv = static_cast<int>(uni(1, 3));
  spec.shape.num_heads_kv = kv;
  spec.shape.num_heads_q = kv * static_cast<int>(uni(1, 3));
  spec.shape.head_dim = 8;
  spec.shape.dtype = uni(0, 1) ? DType::kBFloat16 : DType::kFloat32;
  const int64_t kappa = KvRowBytes(spec.shape, kv);
  spec.recv_buffer_bytes = uni(0, 2) == 0 ? kappa * uni(1, 7) : kDefaultRecvBufferBytes;
  spec.assignment = static_cast<AssignmentPolicy>(uni(1, 3));
  // The third: compute so slow that every backward stage with returns
  // computes most of its home items under them (return_overlap_items).
  const int64_t profile = uni(0, 2);
  spec.profile = profile == 0   ? "h100"
                 : profile == 1 ? "cpu-loopback"
                                : "custom:flops=1e6,inter_bytes_per_s=1e8,intra_bytes_per_s=1e9,"
                                  "inter_latency_us=5";
  const int mode = static_cast<int>(uni(0, 9));
  if (mode == 9 && T > 0) {
    // Shared prefix: documents [p, e) see a prefix [0, p) fully and
    // themselves causally; the prefix is causal.
    const int64_t p = uni(1, T);
    spec.slices.push_back({0, p, 0, p, MaskType::kCausal, 0, -1});
    int64_t x = p;
    while (x < T) {
      const int64_t e = std::min(T, x + uni(1, 20));
      spec.slices.push_back({x, e, 0, p, MaskType::kFull, 0, -1});
      spec.slices.push_back({x, e, x, e, MaskType::kCausal, 0, uni(0, 2) ? -1 : uni(0, 5)});
      x = e;
    }
    return spec;
  }
  spec.cu_seqlens.push_back(0);
  if (mode == 0) {
    spec.cu_seqlens.push_back(T);  // one document spanning every rank
  } else {
    int64_t x = 0;
    while (x < T) {
      const int64_t r = uni(0, 9);
      const int64_t len = r == 0 ? 0 : r == 1 ? 1 : r < 8 ? uni(2, 12) : uni(12, 60);
      x = std::min(T, x + len);
      spec.cu_seqlens.push_back(x);
    }
    if (spec.cu_seqlens.back() != T) spec.cu_seqlens.push_back(T);
  }
  spec.causal = uni(0, 5) != 0;
  spec.window = spec.causal && uni(0, 3) == 0 ? uni(0, 10) : -1;
  return spec;
}

TEST(CompilerPropertyTest, RandomStructures) {
  std::mt19937_64 rng(20261129);
  constexpr int kCases = 1000;
  int checked_plans = 0;
  for (int c = 0; c < kCases; ++c) {
    PlanSpec spec = RandomSpec(rng, c);
    if (!sweep::Keeps(c)) continue;
    // Every strategy on every case; auto on some.
    for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kRing, Strategy::kAllGather,
                       Strategy::kUlysses, Strategy::kUsp, Strategy::kAuto}) {
      if (s == Strategy::kAuto && c % 5 != 0) continue;
      spec.strategy = s;
      SCOPED_TRACE(::testing::Message()
                   << "case " << c << " strategy " << StrategyName(s) << " assignment "
                   << AssignmentName(spec.assignment) << " T " << spec.total_tokens << " topo "
                   << spec.topology.num_nodes << "x" << spec.topology.devices_per_node << " H "
                   << spec.shape.num_heads_q << "/" << spec.shape.num_heads_kv << " budget "
                   << spec.recv_buffer_bytes << " docs " << spec.cu_seqlens.size()
                   << " slices " << spec.slices.size());
      absl::StatusOr<Plan> plan = CompilePlan(spec);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(ValidateDispatch(plan->dispatch).ok());
      // Token counts per rank equal within one token (contiguous, balanced)
      // or two (zigzag: two chunks).
      int64_t lo = INT64_MAX, hi = 0;
      for (int32_t r = 0; r < plan->dispatch.num_ranks(); ++r) {
        lo = std::min(lo, plan->dispatch.TokensOf(r));
        hi = std::max(hi, plan->dispatch.TokensOf(r));
      }
      ASSERT_LE(hi - lo, spec.assignment == AssignmentPolicy::kZigzag ? 2 : 1);
      ASSERT_TRUE(CheckCoverage(*plan).ok()) << CheckCoverage(*plan);
      ASSERT_TRUE(CheckTransfers(*plan).ok()) << CheckTransfers(*plan);
      ASSERT_TRUE(CheckBudget(*plan).ok()) << CheckBudget(*plan);
      const std::vector<int64_t> need = ExactNeedBruteForce(*plan);
      const int64_t kappa = KvRowBytes(spec.shape, spec.shape.num_heads_kv);
      for (const RankPlan& rp : plan->ranks) {
        ASSERT_EQ(rp.stats.exact_need_bytes, need[rp.rank] * kappa) << "rank " << rp.rank;
        if (plan->strategy == Strategy::kSap || plan->strategy == Strategy::kHsap) {
          ASSERT_EQ(rp.stats.FwdRecvBytes(), rp.stats.lower_bound_recv_bytes)
              << "rank " << rp.rank;
        }
        if (plan->strategy == Strategy::kSap) {
          ASSERT_EQ(rp.stats.FwdRecvBytes(), need[rp.rank] * kappa) << "rank " << rp.rank;
          // Backward repeats the K/V and adds the dK/dV partials of what it
          // sent, in fp32 (ReturnBytesRatio times the K/V bytes).
          ASSERT_EQ(rp.stats.BwdRecvBytes(),
                    rp.stats.FwdRecvBytes() +
                        rp.stats.FwdSendBytes() * ReturnBytesRatio(spec.shape.dtype));
        }
        ASSERT_GE(rp.stats.FwdRecvBytes(), rp.stats.lower_bound_recv_bytes);
      }
      if (s == Strategy::kAuto) {
        for (const StrategyCost& cand : plan->stats.candidates) {
          ASSERT_LE(plan->stats.modeled_us, cand.modeled_us);
        }
      }
      // The compiler models each rank where it builds it, from the inner
      // stages' areas; the reference model over the plan's own items must
      // give the same times, to the bit.
      {
        Plan remodeled = *plan;
        ModelPlanTime(GetHardwareProfile(spec.profile), &remodeled);
        ASSERT_EQ(remodeled.stats.modeled_us, plan->stats.modeled_us);
        ASSERT_EQ(remodeled.stats.lower_bound_us, plan->stats.lower_bound_us);
        for (size_t r = 0; r < plan->ranks.size(); ++r) {
          ASSERT_EQ(remodeled.ranks[r].stats.fwd_us, plan->ranks[r].stats.fwd_us) << r;
          ASSERT_EQ(remodeled.ranks[r].stats.bwd_us, plan->ranks[r].stats.bwd_us) << r;
        }
      }
      // Proto round trip keeps the plan and its key.
      const hsap::v1::Plan proto = PlanToProto(*plan);
      absl::StatusOr<Plan> back = PlanFromProto(proto);
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_TRUE(*back == *plan);
      ASSERT_EQ(ComputePlanKey(back->spec, back->format_version), plan->key);
      ++checked_plans;
    }
  }
  EXPECT_GT(checked_plans, sweep::kSanitized ? 1200 : 6000);
}

// auto builds only the candidates its lower bounds cannot exclude (sap's
// raised from its packing); it must still pick what building all six
// picks, and every candidate's figure must be a lower bound of (or equal
// to) that strategy's modeled time.
TEST(CompilerPropertyTest, AutoPicksWhatBuildingAllSixPicks) {
  std::mt19937_64 rng(20261201);
  constexpr Strategy kOrder[] = {Strategy::kSap,       Strategy::kHsap,    Strategy::kRing,
                                 Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp};
  int pruned = 0;
  for (int c = 0; c < 400; ++c) {
    PlanSpec spec = RandomSpec(rng, c);
    spec.strategy = Strategy::kAuto;
    SCOPED_TRACE(::testing::Message() << "case " << c << " T " << spec.total_tokens << " topo "
                                      << spec.topology.num_nodes << "x"
                                      << spec.topology.devices_per_node);
    absl::StatusOr<Plan> chosen = CompilePlan(spec);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    ASSERT_EQ(chosen->stats.candidates.size(), 6u);
    int best = -1;
    std::vector<absl::StatusOr<Plan>> all;
    for (int i = 0; i < 6; ++i) {
      spec.strategy = kOrder[i];
      all.push_back(CompilePlan(spec));
      ASSERT_TRUE(all[i].ok()) << all[i].status();
      const double m = all[i]->stats.modeled_us;
      ASSERT_EQ(chosen->stats.candidates[i].strategy, kOrder[i]);
      ASSERT_LE(chosen->stats.candidates[i].modeled_us, m * (1 + 1e-9)) << StrategyName(kOrder[i]);
      if (chosen->stats.candidates[i].modeled_us < m * (1 - 1e-9)) ++pruned;
      if (best < 0 || m < all[best]->stats.modeled_us) best = i;
    }
    ASSERT_EQ(chosen->strategy, kOrder[best]);
    ASSERT_EQ(chosen->stats.modeled_us, all[best]->stats.modeled_us);
    Plan expected = *all[best];
    expected.spec.strategy = Strategy::kAuto;
    expected.key = chosen->key;
    expected.stats.candidates = chosen->stats.candidates;
    expected.stats.compile_us = chosen->stats.compile_us;
    ASSERT_TRUE(expected == *chosen);
  }
  EXPECT_GT(pruned, 100);  // the bounds do prune
}
}  // namespace
}  // namespace hsap::plan

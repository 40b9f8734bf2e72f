// Numerics of a group as one device would give them (issue "Numerics"):
//  * accuracy: at P = 1..8, for ring, sap, hsap, ulysses, usp and auto, the
//    balanced and zigzag assignments, fp32/bf16/fp16, GQA and MHA, causal,
//    full and windowed documents, every output's relative error against the
//    float64 reference is at most 1.25x the error one rank makes on the same
//    inputs in the same dtype (fp32: at most 1e-5); the worst ratios are
//    printed as a table by P and strategy;
//  * NaN and infinities in q, k, v (and dO) contaminate exactly the outputs
//    the float64 reference's contaminates, at P = 1 and P = 4;
//  * determinism: 1 or 2 kernel threads and any arrival order of the ranks
//    give the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/exec/cpu_backend.h"
#include "server/plan/compiler.h"
#include "tests/numerics/group_harness.h"
#include "tests/numerics/nonfinite_patterns.h"
#include "tests/sanitizers/sweep.h"

namespace hsap {
namespace {

using plan::AssignmentPolicy;
using plan::Strategy;
using testing::GroupOutputs;
using testing::GroupProblem;
using testing::ExpectSameNonFiniteSet;
using testing::ExpectSamePattern;
using testing::Poison;
using testing::Poisoned;

testing::BackendFactory Cpu(int threads) {
  return [threads](int32_t) { return std::make_unique<exec::CpuBackend>(threads); };
}

// cpu-loopback's links with compute a million times slower: every
// backward stage with returns keeps one home item under its K/V transfer
// and computes the rest while the returns fly (Stage::return_overlap_items).
constexpr const char kComputeBound[] =
    "custom:flops=5e4,inter_bytes_per_s=2.7e9,intra_bytes_per_s=6e9,inter_latency_us=50,"
    "intra_latency_us=20";

absl::StatusOr<plan::Plan> Compile(GroupProblem* pr, plan::Topology topo, Strategy s,
                                   AssignmentPolicy a, const char* profile = "cpu-loopback") {
  pr->spec.topology = topo;
  pr->spec.strategy = s;
  pr->spec.assignment = a;
  pr->spec.profile = profile;
  return plan::CompilePlan(pr->spec);
}

// Backward stages of `plan` that compute home items under their returns.
int StagesWithReturnOverlap(const plan::Plan& plan) {
  int n = 0;
  for (const plan::RankPlan& rp : plan.ranks) {
    for (const plan::Stage& st : rp.backward) n += !st.return_overlap_items.empty();
  }
  return n;
}

// Errors of O, LSE, dQ, dK, dV against the reference.
std::vector<double> Errors(const GroupOutputs& got, const GroupOutputs& ref) {
  return {testing::RelativeError(got.o, ref.o), testing::RelativeError(got.lse, ref.lse),
          testing::RelativeError(got.dq, ref.dq), testing::RelativeError(got.dk, ref.dk),
          testing::RelativeError(got.dv, ref.dv)};
}

constexpr const char* kNames[] = {"O", "LSE", "dQ", "dK", "dV"};

// Expects `multi`'s errors against `ref` within one rank's (`single`'s):
// fp32 tensors, the LSE in every dtype, within 1e-5; bf16 and fp16 O, dQ,
// dK, dV within 1.25x one rank's error. Returns the largest ratio of a
// bf16/fp16 error to one rank's (0 when there is none).
double ExpectOneRankErrors(const GroupOutputs& multi, const GroupOutputs& single,
                           const GroupOutputs& ref, DType dtype, const std::string& what) {
  const std::vector<double> e1 = Errors(single, ref), ep = Errors(multi, ref);
  double worst = 0;
  for (int t = 0; t < 5; ++t) {
    if (dtype == DType::kFloat32 || t == 1) {
      EXPECT_LE(ep[t], 1e-5) << kNames[t] << " of " << what;
    } else {
      EXPECT_LE(ep[t], 1.25 * e1[t]) << kNames[t] << " of " << what << " (one rank " << e1[t]
                                     << ")";
      if (e1[t] > 0) worst = std::max(worst, ep[t] / e1[t]);
    }
  }
  return worst;
}

const plan::Topology kTopologies[] = {{1, 1}, {1, 2}, {1, 3}, {2, 2},
                                      {1, 5}, {2, 3}, {1, 7}, {2, 4}};
const Strategy kStrategies[] = {Strategy::kRing,    Strategy::kSap, Strategy::kHsap,
                                Strategy::kUlysses, Strategy::kUsp, Strategy::kAuto};

// Links a hundred times slower than kComputeBound's against the compute:
// hsap across nodes gets its pipelined plan (docs/planner.md).
constexpr const char kSlowLinks[] =
    "custom:flops=2e9,inter_bytes_per_s=1e6,intra_bytes_per_s=1e9";

// hsap's pipelined inter-node stage (chunks received while the previous
// one computes, returns riding later exchanges) gives what one rank gives,
// in fp32, bf16 and fp16, causal, full and windowed, on 2 nodes of 2, 3
// and 4 ranks.
TEST(NumericsTest, PipelinedHsapMatchesOneRank) {
  int c = 0, pipelined = 0;
  for (const plan::Topology& topo : {plan::Topology{2, 2}, plan::Topology{2, 3},
                                     plan::Topology{2, 4}, plan::Topology{3, 2}}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      ++c;
      std::mt19937_64 rng(4100 + c);
      const bool gqa = c % 2 == 0;
      GroupProblem pr = testing::RandomProblem(rng, 300 + rng() % 200, 90, gqa ? 6 : 4,
                                               gqa ? 2 : 4, 32, dtype);
      const int mask = c % 3;  // causal, full, windowed
      pr.spec.causal = mask != 1;
      pr.spec.window = mask == 2 ? 37 : -1;
      const std::string what = absl::StrCat(topo.num_nodes, "x", topo.devices_per_node, " ",
                                            DTypeName(dtype), " mask ", mask);
      GroupProblem one = pr;
      auto one_plan = Compile(&one, {1, 1}, Strategy::kSap, AssignmentPolicy::kContiguous);
      auto plan = Compile(&pr, topo, Strategy::kHsap, AssignmentPolicy::kBalanced, kSlowLinks);
      ASSERT_TRUE(one_plan.ok() && plan.ok()) << what;
      // Head scatter, the chunks' stages, the last stage, head gather.
      pipelined += plan->ranks[0].forward.size() > 3;
      const GroupOutputs ref = testing::Reference(pr);
      const GroupOutputs single = testing::RunGroup(*one_plan, one, Cpu(1));
      const GroupOutputs multi = testing::RunGroup(*plan, pr, Cpu(2));
      ASSERT_TRUE(single.status.ok() && multi.status.ok()) << what << multi.status;
      ExpectOneRankErrors(multi, single, ref, dtype, what);
      // Deterministic: the same plan gives the same bits again.
      const GroupOutputs again = testing::RunGroup(*plan, pr, Cpu(1));
      ASSERT_TRUE(again.status.ok());
      EXPECT_EQ(again.o, multi.o) << what;
      EXPECT_EQ(again.dk, multi.dk) << what;
      EXPECT_EQ(again.dv, multi.dv) << what;
    }
  }
  EXPECT_GE(pipelined, 8);
}

TEST(NumericsTest, EveryRankCountMatchesOneRank) {
  std::map<std::pair<int, std::string>, double> worst;  // (P, strategy) -> ratio
  int c = 0;
  int with_return_overlap = 0;  // plans that compute home items under returns
  for (const plan::Topology& topo : kTopologies) {
    for (Strategy s : kStrategies) {
      for (AssignmentPolicy a : {AssignmentPolicy::kBalanced, AssignmentPolicy::kZigzag}) {
        for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
          ++c;
          if (!sweep::Keeps(c)) continue;
          std::mt19937_64 rng(900 + c);
          const bool gqa = c % 2 == 0;
          GroupProblem pr = testing::RandomProblem(rng, 120 + rng() % 80, 70, gqa ? 6 : 4,
                                                   gqa ? 2 : 4, 32, dtype);
          const int mask = c % 3;  // causal, full, windowed
          pr.spec.causal = mask != 1;
          pr.spec.window = mask == 2 ? 13 : -1;
          const std::string what = absl::StrCat(
              topo.num_nodes, "x", topo.devices_per_node, " ", plan::StrategyName(s), " ",
              plan::AssignmentName(a), " ", DTypeName(dtype), gqa ? " GQA" : " MHA",
              mask == 0 ? " causal" : mask == 1 ? " full" : " window");
          GroupProblem one = pr;
          auto one_plan = Compile(&one, {1, 1}, Strategy::kSap, AssignmentPolicy::kContiguous);
          // Every other case plans for slow compute: its backward computes
          // most home items under the returns.
          auto plan = Compile(&pr, topo, s, a, c % 2 == 1 ? kComputeBound : "cpu-loopback");
          ASSERT_TRUE(one_plan.ok() && plan.ok()) << what;
          with_return_overlap += StagesWithReturnOverlap(*plan) > 0;
          const GroupOutputs ref = testing::Reference(pr);
          const GroupOutputs single = testing::RunGroup(*one_plan, one, Cpu(1));
          const GroupOutputs multi = testing::RunGroup(*plan, pr, Cpu(1));
          ASSERT_TRUE(single.status.ok() && multi.status.ok()) << what << multi.status;
          double& w = worst[{topo.num_ranks(), std::string(plan::StrategyName(s))}];
          w = std::max(w, ExpectOneRankErrors(multi, single, ref, dtype, what));
        }
      }
    }
  }
  // Kept cases of the sweep (one in five under a sanitizer) include such plans.
  EXPECT_GT(with_return_overlap, 0);
  std::printf("worst bf16/fp16 error / one-rank error of O, dQ, dK, dV, by P (rows) and "
              "strategy:\n%4s", "P");
  for (Strategy s : kStrategies) std::printf(" %8s", std::string(plan::StrategyName(s)).c_str());
  std::printf("\n");
  for (const plan::Topology& topo : kTopologies) {
    std::printf("%4d", topo.num_ranks());
    for (Strategy s : kStrategies) {
      std::printf(" %8.4f", worst[{topo.num_ranks(), std::string(plan::StrategyName(s))}]);
    }
    std::printf("\n");
  }
}

TEST(NumericsTest, NanAndInfinityPropagateAsTheReference) {
  const double inf = std::numeric_limits<double>::infinity();
  const Poison poisons[] = {{"q", NAN}, {"q", inf}, {"q", -inf}, {"k", NAN}, {"k", inf},
                            {"k", -inf}, {"v", NAN}, {"v", inf}, {"dO", NAN}, {"dO", -inf}};
  int c = 0;
  for (const plan::Topology& topo : {plan::Topology{1, 1}, plan::Topology{2, 2}}) {
    for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kUlysses}) {
      if (topo.num_ranks() == 1 && s != Strategy::kSap) continue;
      for (const Poison& p : poisons) {
        for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
          ++c;
          if (!sweep::Keeps(c, 2)) continue;
          std::mt19937_64 rng(300 + c);
          GroupProblem pr = testing::RandomProblem(rng, 150, 60, 4, 2, 32, dtype);
          pr.spec.causal = c % 3 != 0;
          // Poison a token inside a document, so masked-out pairs exist on
          // both sides of it.
          const int64_t row = 40 + rng() % 70;
          Poisoned(&pr, p, row, static_cast<int>(rng() % (std::string(p.tensor) == "k" ||
                                                                   std::string(p.tensor) == "v"
                                                               ? 2
                                                               : 4)),
                   static_cast<int>(rng() % 32));
          auto plan = Compile(&pr, topo, s, AssignmentPolicy::kBalanced,
                              c % 4 < 2 ? kComputeBound : "cpu-loopback");
          ASSERT_TRUE(plan.ok()) << plan.status();
          const GroupOutputs got = testing::RunGroup(*plan, pr, Cpu(2));
          ASSERT_TRUE(got.status.ok()) << got.status;
          // Delta = rowsum(dO * O) as flash-attention forms it (from the
          // forward's O): where dO holds an infinity, the dense form
          // sum_j P_j dP_j can be NaN where this is +-inf; both contaminate
          // the same outputs (checked against the dense reference below).
          const GroupOutputs ref = testing::Reference(pr, got.o_storage);
          const GroupOutputs dense = testing::Reference(pr);
          const std::string what = absl::StrCat(topo.num_ranks(), " ranks ", plan::StrategyName(s),
                                                " ", p.tensor, "=", p.value, " ", DTypeName(dtype),
                                                pr.spec.causal ? " causal" : " full");
          ExpectSamePattern(got.o, ref.o, "O of " + what);
          ExpectSamePattern(got.lse, ref.lse, "LSE of " + what);
          ExpectSamePattern(got.dq, ref.dq, "dQ of " + what);
          ExpectSamePattern(got.dk, ref.dk, "dK of " + what);
          ExpectSamePattern(got.dv, ref.dv, "dV of " + what);
          ExpectSameNonFiniteSet(got.dq, dense.dq, "dQ (dense reference) of " + what);
          ExpectSameNonFiniteSet(got.dk, dense.dk, "dK (dense reference) of " + what);
          ExpectSameNonFiniteSet(got.dv, dense.dv, "dV (dense reference) of " + what);
        }
      }
    }
  }
}

// Logits beyond fp32's range: inputs this large run on the exact tiles.
// q, k ~ 1e20 on one rank: the float64 outputs, an LSE beyond fp32's range
// saturated at +-FLT_MAX. q, k ~ 1e18 (logits ~1e36, LSE in
// range) at P = 1 and 4: the float64 outputs. (At P > 1 a partial LSE
// beyond fp32's range cannot be merged: docs/numerics.md.)
TEST(NumericsTest, LogitOverflowGivesTheReferenceOutputs) {
  for (const float factor : {1e20f, 1e18f}) {
    std::mt19937_64 rng(17);
    GroupProblem pr = testing::RandomProblem(rng, 90, 40, 2, 1, 32, DType::kFloat32);
    auto scale = [&](std::vector<char>* t) {
      float* f = reinterpret_cast<float*>(t->data());
      for (size_t i = 0; i < t->size() / 4; ++i) f[i] *= factor;
    };
    scale(&pr.q);
    scale(&pr.k);
    for (const plan::Topology& topo : {plan::Topology{1, 1}, plan::Topology{1, 4}}) {
      if (factor > 1e19f && topo.num_ranks() > 1) continue;
      auto plan = Compile(&pr, topo, Strategy::kSap, AssignmentPolicy::kBalanced);
      ASSERT_TRUE(plan.ok());
      const GroupOutputs got = testing::RunGroup(*plan, pr, Cpu(1));
      ASSERT_TRUE(got.status.ok()) << got.status;
      const GroupOutputs ref = testing::Reference(pr);
      const std::string what = absl::StrCat(factor, " at P = ", topo.num_ranks());
      ExpectSamePattern(got.o, ref.o, "O " + what);
      EXPECT_LE(testing::RelativeError(got.o, ref.o), 1e-5) << what;
      // An LSE beyond fp32's range saturates at +-FLT_MAX.
      constexpr double kMax = std::numeric_limits<float>::max();
      std::vector<double> saturated = ref.lse;
      int64_t beyond = 0;
      for (double& x : saturated) {
        beyond += std::abs(x) > kMax;
        x = std::clamp(x, -kMax, kMax);
      }
      if (factor > 1e19f) {
        EXPECT_GT(beyond, 0) << what;
      }
      EXPECT_LE(testing::RelativeError(got.lse, saturated), 1e-5) << what;
    }
  }
}

TEST(NumericsTest, SameBitsForAnyThreadCountAndArrivalOrder) {
  for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kRing, Strategy::kUlysses}) {
   for (const char* profile : {"cpu-loopback", kComputeBound}) {
    std::mt19937_64 rng(55);
    GroupProblem pr = testing::RandomProblem(rng, 700, 300, 6, 2, 64, DType::kBFloat16);
    auto plan = Compile(&pr, {2, 2}, s, AssignmentPolicy::kBalanced, profile);
    ASSERT_TRUE(plan.ok());
    if (profile == kComputeBound && s != Strategy::kUlysses) {
      EXPECT_GT(StagesWithReturnOverlap(*plan), 0) << plan::StrategyName(s);
    }
    const GroupOutputs a = testing::RunGroup(*plan, pr, Cpu(1));
    std::vector<int32_t> order = {3, 1, 0, 2};
    const GroupOutputs b = testing::RunGroup(*plan, pr, Cpu(2), order);
    std::shuffle(order.begin(), order.end(), rng);
    const GroupOutputs c = testing::RunGroup(*plan, pr, Cpu(2), order);
    ASSERT_TRUE(a.status.ok() && b.status.ok() && c.status.ok());
    for (const GroupOutputs* x : {&b, &c}) {
      EXPECT_EQ(x->o_storage, a.o_storage) << plan::StrategyName(s);
      // Bitwise equality of the doubles widened from the same storage.
      EXPECT_TRUE(std::equal(x->lse.begin(), x->lse.end(), a.lse.begin(), [](double u, double v) {
        return u == v || (std::isnan(u) && std::isnan(v));
      })) << plan::StrategyName(s);
      EXPECT_EQ(x->dq, a.dq) << plan::StrategyName(s);
      EXPECT_EQ(x->dk, a.dk) << plan::StrategyName(s);
      EXPECT_EQ(x->dv, a.dv) << plan::StrategyName(s);
    }
   }
  }
}

}  // namespace
}  // namespace hsap

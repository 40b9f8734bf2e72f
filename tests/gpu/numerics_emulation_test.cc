// The numerics of tests/numerics/numerics_test.cc for the executor's CUDA
// backend (server/exec/cuda_backend.h), run on the CPU through the CUDA
// kernels' emulation (//kernels/cuda:attention_emulated): the kernels'
// own source, the scan and exact kernels included (exact_kernels.cuh).
//  * NaN and infinities in q, k, v, dO contaminate exactly the outputs the
//    float64 reference's contaminates, at P = 1 and P = 4 (2x2), bf16 (the
//    CUDA kernels take bf16/fp16, head_dim 64/128/256), and the outputs
//    that stay finite are within twice the dtype's rounding of the reference;
//  * logits beyond fp32's range (q, k ~ 1e20 and 1e18 in bf16): the
//    float64 outputs, the LSE saturated at +-FLT_MAX;
//  * accuracy: P = 1, 2, 4, strategies sap, hsap, ulysses, bf16 and fp16:
//    O, dQ, dK, dV within 1.25x the one-rank error of the same backend.
// Small problems: the emulation runs every CUDA thread as a fiber.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/exec/cuda_backend.h"
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
using Outputs = std::pair<const std::vector<double>*, const std::vector<double>*>;

std::unique_ptr<exec::ComputeBackend> EmulatedBackend(int32_t) {
  auto b = exec::CudaBackend::Create({.memory_host_visible = true});
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : nullptr;
}

absl::StatusOr<plan::Plan> Compile(GroupProblem* pr, plan::Topology topo, Strategy s,
                                   AssignmentPolicy a) {
  pr->spec.topology = topo;
  pr->spec.strategy = s;
  pr->spec.assignment = a;
  pr->spec.profile = "cpu-loopback";
  return plan::CompilePlan(pr->spec);
}

// Relative error over the entries both sides hold finite (fp32 rounding of
// the reference), and the dtype's rounding error over the same entries.
std::pair<double, double> FiniteErrorAndYardstick(const std::vector<double>& got,
                                                  const std::vector<double>& ref, DType dtype) {
  std::vector<double> a, b;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    if (std::isfinite(got[i]) && std::isfinite(static_cast<float>(ref[i]))) {
      a.push_back(got[i]);
      b.push_back(ref[i]);
    }
  }
  return {testing::RelativeError(a, b), std::max(testing::RoundingError(b, dtype), 1e-5)};
}

// numerics_test's NaN/Inf cases: every poison at P = 1 (sap) and at P = 4
// (2x2; sap, hsap and ulysses in rotation over the poisons, as the
// emulation is slow), bf16, causal and full documents in turn.
TEST(NumericsEmulationTest, NanAndInfinityPropagateAsTheReference) {
  const double inf = std::numeric_limits<double>::infinity();
  const Poison poisons[] = {{"q", NAN}, {"q", inf}, {"q", -inf}, {"k", NAN}, {"k", inf},
                            {"k", -inf}, {"v", NAN}, {"v", inf}, {"dO", NAN}, {"dO", -inf}};
  const Strategy kRotation[] = {Strategy::kSap, Strategy::kHsap, Strategy::kUlysses};
  const DType dtype = DType::kBFloat16;
  constexpr int kDim = 64;
  int c = 0;
  for (const plan::Topology& topo : {plan::Topology{1, 1}, plan::Topology{2, 2}}) {
    for (const Poison& p : poisons) {
      ++c;
      // Sanitized: every other poison on each topology, the other half on
      // the other one (every poison is kept once).
      if (!sweep::Keeps(c + topo.num_ranks(), 2)) continue;
      const Strategy s = topo.num_ranks() == 1 ? Strategy::kSap : kRotation[c % 3];
      std::mt19937_64 rng(300 + c);
      GroupProblem pr = testing::RandomProblem(rng, 72, 40, 4, 2, kDim, dtype);
      pr.spec.causal = c % 3 != 0;
      // A token inside the problem, so masked-out pairs exist on both sides.
      const int64_t row = 20 + rng() % 32;
      const bool kv = std::string(p.tensor) == "k" || std::string(p.tensor) == "v";
      const int head = static_cast<int>(rng() % (kv ? 2 : 4));
      Poisoned(&pr, p, row, head, static_cast<int>(rng() % kDim));
      auto plan = Compile(&pr, topo, s, AssignmentPolicy::kBalanced);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const GroupOutputs got = testing::RunGroup(*plan, pr, EmulatedBackend);
      ASSERT_TRUE(got.status.ok()) << got.status;
      // Delta from the forward's O, as numerics_test (docs/numerics.md).
      const GroupOutputs ref = testing::Reference(pr, got.o_storage);
      const GroupOutputs dense = testing::Reference(pr);
      const std::string what =
          absl::StrCat(topo.num_ranks(), " ranks ", plan::StrategyName(s), " ", p.tensor, "=",
                       p.value, " ", DTypeName(dtype), pr.spec.causal ? " causal" : " full");
      const std::pair<const char*, Outputs> outputs[] = {
          {"O", {&got.o, &ref.o}},    {"LSE", {&got.lse, &ref.lse}}, {"dQ", {&got.dq, &ref.dq}},
          {"dK", {&got.dk, &ref.dk}}, {"dV", {&got.dv, &ref.dv}}};
      for (const auto& [name, pair] : outputs) {
        ExpectSamePattern(*pair.first, *pair.second, absl::StrCat(name, " of ", what));
        const auto [err, yardstick] = FiniteErrorAndYardstick(*pair.first, *pair.second, dtype);
        EXPECT_LE(err, 2 * yardstick) << "finite entries of " << name << " of " << what;
      }
      ExpectSameNonFiniteSet(got.dq, dense.dq, "dQ (dense reference) of " + what);
      ExpectSameNonFiniteSet(got.dk, dense.dk, "dK (dense reference) of " + what);
      ExpectSameNonFiniteSet(got.dv, dense.dv, "dV (dense reference) of " + what);
    }
  }
}

// bf16 holds fp32's range, so logits can overflow the fast kernels' fp32
// arithmetic; the scan sends such items to the exact kernels. As
// numerics_test: q, k ~ 1e20 (logits ~1e40) on one rank give the float64
// O and an LSE saturated at +-FLT_MAX; q, k ~ 1e18 (logits ~1e36, LSE in
// range) at P = 1 and 4 give the float64 O and LSE.
TEST(NumericsEmulationTest, LogitOverflowGivesTheReferenceOutputs) {
  for (const float factor : {1e20f, 1e18f}) {
    std::mt19937_64 rng(17);
    GroupProblem pr = testing::RandomProblem(rng, 60, 30, 2, 1, 64, DType::kBFloat16);
    for (std::vector<char>* t : {&pr.q, &pr.k}) {
      for (size_t i = 0; i < t->size() / 2; ++i) {
        StoreFromFloat(t->data(), DType::kBFloat16, i,
                       LoadAsFloat(t->data(), DType::kBFloat16, i) * factor);
      }
    }
    for (const plan::Topology& topo : {plan::Topology{1, 1}, plan::Topology{1, 4}}) {
      if (factor > 1e19f && topo.num_ranks() > 1) continue;  // docs/numerics.md: known limit
      auto plan = Compile(&pr, topo, Strategy::kSap, AssignmentPolicy::kBalanced);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const GroupOutputs got = testing::RunGroup(*plan, pr, EmulatedBackend);
      ASSERT_TRUE(got.status.ok()) << got.status;
      const GroupOutputs ref = testing::Reference(pr);
      const std::string what = absl::StrCat(factor, " at P = ", topo.num_ranks());
      ExpectSamePattern(got.o, ref.o, "O " + what);
      EXPECT_LE(testing::RelativeError(got.o, ref.o),
                2 * std::max(testing::RoundingError(ref.o, DType::kBFloat16), 1e-5))
          << what;
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

// Errors of O, dQ, dK, dV against the reference.
std::vector<double> Errors(const GroupOutputs& got, const GroupOutputs& ref) {
  return {testing::RelativeError(got.o, ref.o), testing::RelativeError(got.dq, ref.dq),
          testing::RelativeError(got.dk, ref.dk), testing::RelativeError(got.dv, ref.dv)};
}

constexpr const char* kNames[] = {"O", "dQ", "dK", "dV"};

// P = 1, 2, 4 x sap, hsap, ulysses x bf16, fp16 against one rank of the
// same backend on the same inputs (GQA causal in bf16, MHA full in fp16).
TEST(NumericsEmulationTest, EveryRankCountMatchesOneRank) {
  double worst = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const bool bf16 = dtype == DType::kBFloat16;
    std::mt19937_64 rng(bf16 ? 901 : 902);
    GroupProblem pr = testing::RandomProblem(rng, 80, 40, 4, bf16 ? 2 : 4, 64, dtype);
    pr.spec.causal = bf16;
    GroupProblem one = pr;
    auto one_plan = Compile(&one, {1, 1}, Strategy::kSap, AssignmentPolicy::kContiguous);
    ASSERT_TRUE(one_plan.ok()) << one_plan.status();
    const GroupOutputs ref = testing::Reference(pr);
    const GroupOutputs single = testing::RunGroup(*one_plan, one, EmulatedBackend);
    ASSERT_TRUE(single.status.ok()) << single.status;
    const std::vector<double> e1 = Errors(single, ref);
    int combo = 0;
    for (const plan::Topology& topo :
         {plan::Topology{1, 1}, plan::Topology{1, 2}, plan::Topology{2, 2}}) {
      for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kUlysses}) {
        if (!sweep::Keeps(combo++, 2)) continue;
        auto plan = Compile(&pr, topo, s, AssignmentPolicy::kBalanced);
        ASSERT_TRUE(plan.ok()) << plan.status();
        const std::string what = absl::StrCat(topo.num_nodes, "x", topo.devices_per_node, " ",
                                              plan::StrategyName(s), " ", DTypeName(dtype));
        const GroupOutputs multi = testing::RunGroup(*plan, pr, EmulatedBackend);
        ASSERT_TRUE(multi.status.ok()) << what << ": " << multi.status;
        const std::vector<double> ep = Errors(multi, ref);
        for (int t = 0; t < 4; ++t) {
          EXPECT_LE(ep[t], 1.25 * e1[t]) << kNames[t] << " of " << what << " (one rank " << e1[t]
                                         << ")";
          if (e1[t] > 0) worst = std::max(worst, ep[t] / e1[t]);
        }
      }
    }
  }
  std::printf("worst bf16/fp16 error / one-rank error of O, dQ, dK, dV: %.4f\n", worst);
}

}  // namespace
}  // namespace hsap

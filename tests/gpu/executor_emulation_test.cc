// The executor's CUDA backend (server/exec/cuda_backend.h) running whole
// plans on the CPU: the CUDA kernels' own source through the emulation
// (//kernels/cuda:attention_emulated), every rank on its own backend, over
// the in-process fabric. 1x1, 1x4 and 2x2 plans, every strategy (the three
// assignments in rotation), bf16 and fp16, forward and backward, against the float64
// reference with the kernels' yardstick: each output's error at most twice
// the error the dtype's rounding alone makes on the exact result. Runs in CI
// (no GPU).
#include <cstdio>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/exec/cuda_backend.h"
#include "server/plan/compiler.h"
#include "tests/numerics/group_harness.h"
#include "tests/sanitizers/sweep.h"

namespace hsap {
namespace {

using plan::AssignmentPolicy;
using plan::Strategy;

constexpr Strategy kStrategies[] = {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses,
                                    Strategy::kUsp,  Strategy::kSap,       Strategy::kHsap,
                                    Strategy::kAuto};
constexpr AssignmentPolicy kAssignments[] = {
    AssignmentPolicy::kContiguous, AssignmentPolicy::kZigzag, AssignmentPolicy::kBalanced};

std::unique_ptr<exec::ComputeBackend> EmulatedBackend(int32_t) {
  auto b = exec::CudaBackend::Create({.memory_host_visible = true});
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : nullptr;
}

class ExecutorEmulationTest : public ::testing::TestWithParam<plan::Topology> {};

TEST_P(ExecutorEmulationTest, PlansMatchTheReference) {
  const plan::Topology topo = GetParam();
  std::mt19937_64 rng(77 + topo.num_ranks() * 3 + topo.num_nodes);
  double worst = 0;
  int c = 0;
  for (Strategy s : kStrategies) {
    {
      // One assignment per strategy, rotating (the emulation is slow).
      const AssignmentPolicy a = kAssignments[(c + topo.num_ranks()) % 3];
      ++c;
      // Rotate dtype, causal/full and GQA over the cases.
      const DType dtype = c % 2 ? DType::kBFloat16 : DType::kFloat16;
      const int hkv = c % 3 == 0 ? 4 : 2;
      testing::GroupProblem pr = testing::RandomProblem(rng, 64 + rng() % 48, 50, 4, hkv, 64, dtype);
      if (!sweep::Keeps(c, 2)) continue;
      pr.spec.causal = c % 4 != 1;
      pr.spec.topology = topo;
      pr.spec.strategy = s;
      pr.spec.assignment = a;
      pr.spec.profile = "cpu-loopback";
      auto plan = plan::CompilePlan(pr.spec);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::string what =
          absl::StrCat(topo.num_nodes, "x", topo.devices_per_node, " ", plan::StrategyName(s),
                       " ", plan::AssignmentName(a), " ", DTypeName(dtype), " Hkv ", hkv,
                       pr.spec.causal ? " causal" : " full", " T ", pr.spec.total_tokens);
      const testing::GroupOutputs got = testing::RunGroup(*plan, pr, EmulatedBackend);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      const testing::GroupOutputs ref = testing::Reference(pr, got.o_storage);
      const std::pair<const char*, std::pair<const std::vector<double>*, const std::vector<double>*>>
          outputs[] = {{"O", {&got.o, &ref.o}},    {"LSE", {&got.lse, &ref.lse}},
                       {"dQ", {&got.dq, &ref.dq}}, {"dK", {&got.dk, &ref.dk}},
                       {"dV", {&got.dv, &ref.dv}}};
      for (const auto& [name, pair] : outputs) {
        const double err = testing::RelativeError(*pair.first, *pair.second);
        const double yardstick = std::max(testing::RoundingError(*pair.second, dtype), 1e-5);
        EXPECT_LE(err, 2 * yardstick) << name << " of " << what;
        worst = std::max(worst, err / yardstick);
      }
    }
  }
  std::printf("%dx%d: worst error / rounding yardstick %.3f over %d plans\n", topo.num_nodes,
              topo.devices_per_node, worst, c);
}

INSTANTIATE_TEST_SUITE_P(Topologies, ExecutorEmulationTest,
                         ::testing::Values(plan::Topology{1, 1}, plan::Topology{1, 4},
                                           plan::Topology{2, 2}),
                         [](const ::testing::TestParamInfo<plan::Topology>& info) {
                           return absl::StrCat(info.param.num_nodes, "x",
                                               info.param.devices_per_node);
                         });

// What the CUDA backend refuses, naming the field: fp32 storage and head
// dims the kernels do not have.
TEST(ExecutorEmulation, UnsupportedShapesAreInvalidArgument) {
  std::mt19937_64 rng(5);
  for (auto [dtype, d] : {std::pair{DType::kFloat32, 64}, std::pair{DType::kBFloat16, 32}}) {
    testing::GroupProblem pr = testing::RandomProblem(rng, 40, 20, 2, 1, d, dtype);
    pr.spec.topology = {1, 1};
    pr.spec.strategy = Strategy::kSap;
    auto plan = plan::CompilePlan(pr.spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const testing::GroupOutputs got = testing::RunGroup(*plan, pr, EmulatedBackend);
    EXPECT_EQ(got.status.code(), absl::StatusCode::kInvalidArgument) << got.status;
    EXPECT_NE(got.status.message().find(dtype == DType::kFloat32 ? "dtype" : "head_dim"),
              std::string::npos)
        << got.status;
  }
}

}  // namespace
}  // namespace hsap

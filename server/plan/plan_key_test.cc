#include "server/plan/plan_key.h"

#include <set>

#include "gtest/gtest.h"
#include "server/plan/plan.h"
#include "server/plan/plan_spec.h"

namespace hsap::plan {
namespace {

PlanSpec Base() {
  PlanSpec spec;
  spec.cu_seqlens = {0, 100, 250};
  spec.total_tokens = 250;
  spec.topology = {2, 4};
  spec.shape = {32, 8, 128, DType::kBFloat16};
  spec.strategy = Strategy::kHsap;
  return spec;
}

TEST(PlanKeyTest, StableAcrossProcessesAndBuilds) {
  // A golden value: the key must never change for the same spec and format
  // version, or daemons of different builds would disagree on plans (change
  // it only together with kPlanFormatVersion).
  EXPECT_EQ(ComputePlanKey(Base(), 1).ToHex(), "d9d8c79ca8394df900c91e27bca9fd4b");
}

TEST(PlanKeyTest, EveryFieldChangesTheKey) {
  std::vector<PlanSpec> specs(14, Base());
  specs[1].cu_seqlens = {0, 101, 250};
  specs[2].causal = false;
  specs[3].window = 7;
  specs[4].total_tokens = 251;
  specs[5].topology = {4, 2};
  specs[6].shape.num_heads_q = 16;
  specs[7].shape.num_heads_kv = 4;
  specs[8].shape.head_dim = 64;
  specs[9].shape.dtype = DType::kFloat16;
  specs[10].strategy = Strategy::kSap;
  specs[11].assignment = AssignmentPolicy::kZigzag;
  specs[12].profile = "h200";
  specs[13].recv_buffer_bytes = 1 << 20;
  std::set<std::string> keys;
  for (const PlanSpec& s : specs) keys.insert(ComputePlanKey(s, kPlanFormatVersion).ToHex());
  EXPECT_EQ(keys.size(), specs.size());
  EXPECT_NE(ComputePlanKey(Base(), 1), ComputePlanKey(Base(), 2));
  PlanSpec slices = Base();
  slices.cu_seqlens.clear();
  slices.slices = LowerDocuments(Base().cu_seqlens, true, -1);
  EXPECT_NE(ComputePlanKey(slices, 1), ComputePlanKey(Base(), 1));
}

TEST(PlanKeyTest, HexRoundTrip) {
  const PlanKey k = ComputePlanKey(Base(), 1);
  PlanKey back;
  ASSERT_TRUE(PlanKey::FromHex(k.ToHex(), &back));
  EXPECT_EQ(back, k);
  EXPECT_FALSE(PlanKey::FromHex("xyz", &back));
  EXPECT_FALSE(PlanKey::FromHex(std::string(32, 'G'), &back));
}

}  // namespace
}  // namespace hsap::plan

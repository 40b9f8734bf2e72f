#include <algorithm>
#include "server/plan/compiler.h"

#include "gtest/gtest.h"
#include "server/plan/plan_checker.h"
#include "server/plan/plan_proto.h"

namespace hsap::plan {
namespace {

PlanSpec Spec(Strategy s) {
  PlanSpec spec;
  spec.cu_seqlens = {0, 300, 310, 311, 311, 700, 1000};
  spec.total_tokens = 1000;
  spec.topology = {2, 4};
  spec.shape = {8, 2, 16, DType::kBFloat16};
  spec.strategy = s;
  return spec;
}

TEST(CompilerTest, BudgetSplitsTransfersIntoStages) {
  PlanSpec spec = Spec(Strategy::kSap);
  spec.assignment = AssignmentPolicy::kContiguous;
  const int64_t kappa = KvRowBytes(spec.shape, 2);
  spec.recv_buffer_bytes = 16 * kappa;
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  EXPECT_GT(plan->stats.num_fwd_stages, 5);
  EXPECT_TRUE(CheckBudget(*plan).ok());
  EXPECT_TRUE(CheckTransfers(*plan).ok());
  for (const RankPlan& rp : plan->ranks) {
    // The K/V buffer holds 16 rows; the returned fp32 dK/dV buffer twice the
    // bytes of the bf16 rows it returns for.
    EXPECT_LE(rp.stats.peak_recv_buffer_bytes, 16 * kappa * ReturnBytesRatio(spec.shape.dtype));
    EXPECT_EQ(rp.stats.FwdRecvBytes(), rp.stats.lower_bound_recv_bytes);
    // Local work runs while the first transfers are in flight.
    size_t overlap = 0;
    for (size_t s = 1; s < rp.forward.size(); ++s) overlap += rp.forward[s].overlap_items.size();
    EXPECT_EQ(overlap, 0u);
  }
  // Peak memory does not depend on the documents: any structure stays within.
  spec.cu_seqlens = {0, 1000};
  plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(CheckBudget(*plan).ok());
}

// The plan stores each repeated list once (shared_list.h): the ranks of a
// head group share their work items, a backward stage shares its forward
// stage's transfers and items, and the returns share the transfers'
// segments. A plan rebuilt from its proto form shares nothing, is equal, and
// takes more memory.
TEST(CompilerTest, PlanSharesRepeatedLists) {
  PlanSpec spec = Spec(Strategy::kHsap);
  spec.assignment = AssignmentPolicy::kContiguous;
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  int shared_items = 0, shared_returns = 0;
  for (const RankPlan& rp : plan->ranks) {
    const RankPlan& first = plan->ranks[rp.rank / 4 * 4];  // slot 0 of the node
    ASSERT_EQ(rp.forward.size(), rp.backward.size());
    // Inner stages: all but the head scatter and gather.
    for (size_t s = 1; s + 1 < rp.forward.size(); ++s) {
      const Stage& f = rp.forward[s];
      const Stage& b = rp.backward[s];
      if (!f.items.empty()) {
        EXPECT_TRUE(f.items.SharesWith(b.items));
        EXPECT_TRUE(f.items.SharesWith(first.forward[s].items));
        ++shared_items;
      }
      // A pipelined plan computes the received items in overlap lists,
      // scheduled once per head group.
      if (!f.overlap_items.empty()) {
        EXPECT_TRUE(f.overlap_items.SharesWith(first.forward[s].overlap_items));
        EXPECT_TRUE(b.overlap_items.SharesWith(first.backward[s].overlap_items));
        ++shared_items;
      }
      // The backward repeats the K/V transfers (shared) where no returns
      // ride its exchange (a pipelined plan's stages from the third on).
      if (!f.recvs.empty() && b.recvs.size() == f.recvs.size()) {
        EXPECT_TRUE(f.recvs.SharesWith(b.recvs));
      }
      if (!f.sends.empty() && b.sends.size() == f.sends.size()) {
        EXPECT_TRUE(f.sends.SharesWith(b.sends));
      }
    }
    // Every returned send's rows are a forward receive's segments (shared).
    std::vector<const void*> received;
    for (const Stage& f : rp.forward) {
      for (const Transfer& t : f.recvs) received.push_back(t.segments.Identity());
    }
    for (const Stage& b : rp.backward) {
      for (const TransferList* list : {&b.sends, &b.return_sends}) {
        for (const Transfer& t : *list) {
          if (t.payload != Payload::kGradKv) continue;
          ++shared_returns;
          EXPECT_NE(std::find(received.begin(), received.end(), t.segments.Identity()),
                    received.end());
        }
      }
    }
  }
  EXPECT_GT(shared_returns, 0);
  EXPECT_GT(shared_items, 0);
  auto copy = PlanFromProto(PlanToProto(*plan));
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(*copy == *plan);
  EXPECT_GT(copy->ApproxBytes(), plan->ApproxBytes());
}

TEST(CompilerTest, HsapCrossesNodesOnlyForNeededKeys) {
  PlanSpec spec = Spec(Strategy::kHsap);
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->head_group_size, 4);
  for (const RankPlan& rp : plan->ranks) {
    EXPECT_EQ(rp.stats.FwdRecvBytes(), rp.stats.lower_bound_recv_bytes);
    for (const Stage& st : rp.forward) {
      for (const Transfer& t : st.recvs) {
        if (t.payload == Payload::kKv) {
          EXPECT_EQ(t.tier, LinkTier::kInterNode);
          EXPECT_EQ(t.peer % 4, rp.rank % 4);  // same head slot on the other node
        } else {
          EXPECT_EQ(t.tier, LinkTier::kIntraNode);
        }
      }
    }
  }
  EXPECT_TRUE(CheckCoverage(*plan).ok());
}

TEST(CompilerTest, AutoIsNeverSlowerThanAnyStrategy) {
  for (const char* profile : {"h100", "cpu-loopback"}) {
    PlanSpec spec = Spec(Strategy::kAuto);
    spec.profile = profile;
    auto best = CompilePlan(spec);
    ASSERT_TRUE(best.ok());
    EXPECT_EQ(best->stats.candidates.size(), 6u);
    for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                       Strategy::kSap, Strategy::kHsap}) {
      spec.strategy = s;
      auto p = CompilePlan(spec);
      ASSERT_TRUE(p.ok());
      EXPECT_LE(best->stats.modeled_us, p->stats.modeled_us) << StrategyName(s);
    }
    EXPECT_NE(best->strategy, Strategy::kAuto);
  }
}

TEST(CompilerTest, DeterministicAndKeyed) {
  auto a = CompilePlan(Spec(Strategy::kSap));
  auto b = CompilePlan(Spec(Strategy::kSap));
  ASSERT_TRUE(a.ok() && b.ok());
  b->stats.compile_us = a->stats.compile_us;
  EXPECT_TRUE(*a == *b);
  EXPECT_EQ(a->key, ComputePlanKey(Spec(Strategy::kSap), kPlanFormatVersion));
}

TEST(CompilerTest, ProtoRejectsAForeignKey) {
  auto plan = CompilePlan(Spec(Strategy::kRing));
  ASSERT_TRUE(plan.ok());
  hsap::v1::Plan proto = PlanToProto(*plan);
  proto.set_plan_key(std::string(32, '0'));
  auto back = PlanFromProto(proto);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("is not the key of its spec"), std::string::npos);
  proto = PlanToProto(*plan);
  proto.mutable_spec()->mutable_shape()->set_dtype(hsap::v1::DTYPE_INT32);
  EXPECT_NE(PlanFromProto(proto).status().message().find("shape.dtype is DTYPE_INT32"),
            std::string::npos);
  // Proto defaults map to the server's defaults.
  hsap::v1::PlanSpec wire = PlanSpecToProto(Spec(Strategy::kSap));
  wire.clear_strategy();
  wire.clear_assignment();
  wire.clear_profile();
  wire.clear_recv_buffer_bytes();
  auto spec = PlanSpecFromProto(wire);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->strategy, Strategy::kAuto);
  EXPECT_EQ(spec->assignment, AssignmentPolicy::kBalanced);
  EXPECT_EQ(spec->profile, "cpu-loopback");  // SpecDefaults: hsapd's --profile default
  auto h100 = PlanSpecFromProto(wire, {.profile = "h100"});
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->profile, "h100");
  EXPECT_EQ(spec->recv_buffer_bytes, kDefaultRecvBufferBytes);
}

TEST(CompilerTest, ByteTotalsOverAllRanksCannotOverflow) {
  // 2^30 tokens x 81,920-byte rows fit 2^62, but not summed over 2^16 ranks.
  PlanSpec spec = Spec(Strategy::kSap);
  spec.total_tokens = int64_t{1} << 30;
  spec.cu_seqlens.clear();
  for (int64_t x = 0; x <= spec.total_tokens; x += int64_t{1} << 19) spec.cu_seqlens.push_back(x);
  spec.shape = {4096, 4096, 1, DType::kBFloat16};
  spec.recv_buffer_bytes = int64_t{1} << 32;  // 2^30 rows in 4096 stages
  spec.topology = {1, 1};
  EXPECT_TRUE(ValidatePlanSpec(spec).ok()) << ValidatePlanSpec(spec);
  spec.topology = {256, 256};
  const absl::Status s = ValidatePlanSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("x 65536 ranks overflows 2^62 bytes"), std::string::npos) << s;
}

TEST(CompilerTest, EmptySequence) {
  PlanSpec spec = Spec(Strategy::kSap);
  spec.cu_seqlens = {0};
  spec.total_tokens = 0;
  auto plan = CompilePlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stats.total_area, 0);
  EXPECT_EQ(plan->stats.imbalance, 1.0);
}

}  // namespace
}  // namespace hsap::plan

// Hardware profiles: the named table, the parametric "custom:..." syntax
// (every field, defaults, every error naming the field and its value), the
// canonical string, and that a compile models with the parsed figures.
#include "server/plan/cost_model.h"
#include "server/plan/plan_checker.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/plan/compiler.h"

namespace hsap::plan {
namespace {

void ExpectProfileError(const std::string& name, const std::string& text) {
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(name);
  ASSERT_FALSE(p.ok()) << name << " expected: " << text;
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_NE(p.status().message().find(text), std::string::npos)
      << p.status() << "\nexpected: " << text;
  EXPECT_FALSE(IsKnownProfile(name));
}

TEST(CostModelProfileTest, NamedProfiles) {
  for (const std::string& name : HardwareProfileNames()) {
    absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->name, name);
    EXPECT_TRUE(IsKnownProfile(name));
  }
  const HardwareProfile h100 = GetHardwareProfile("h100");
  EXPECT_EQ(h100.attention_flops, 400e12);
  EXPECT_EQ(h100.inter_bytes_per_s, 45e9);
  EXPECT_EQ(h100.intra_bytes_per_s, 360e9);
  EXPECT_EQ(h100.inter_latency_s, 15e-6);
  EXPECT_EQ(h100.intra_latency_s, 8e-6);
}

TEST(CostModelProfileTest, CustomEveryField) {
  const std::string name =
      "custom:flops=6.25e9,inter_bytes_per_s=703125,intra_bytes_per_s=2e9,"
      "inter_latency_us=250,intra_latency_us=30.5,backward_factor=3";
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(name);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, name);
  EXPECT_EQ(p->attention_flops, 6.25e9);
  EXPECT_EQ(p->inter_bytes_per_s, 703125);
  EXPECT_EQ(p->intra_bytes_per_s, 2e9);
  EXPECT_EQ(p->inter_latency_s, 250e-6);
  EXPECT_EQ(p->intra_latency_s, 30.5e-6);
  EXPECT_EQ(p->backward_factor, 3);
  EXPECT_TRUE(IsKnownProfile(name));
}

TEST(CostModelProfileTest, CustomDefaultsAndAnyOrder) {
  absl::StatusOr<HardwareProfile> p =
      ParseHardwareProfile("custom:intra_bytes_per_s=1e10,flops=1e12,inter_bytes_per_s=1e9");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->attention_flops, 1e12);
  EXPECT_EQ(p->inter_latency_s, 0);
  EXPECT_EQ(p->intra_latency_s, 0);
  EXPECT_EQ(p->backward_factor, 2.5);
}

TEST(CostModelProfileTest, CustomErrorsNameTheField) {
  const std::string base = "custom:flops=1e12,inter_bytes_per_s=1e9,intra_bytes_per_s=1e10";
  ExpectProfileError("custom:flops=1e12,inter_bytes_per_s=1e9",
                     "field intra_bytes_per_s is missing; fields: flops, inter_bytes_per_s, "
                     "intra_bytes_per_s, inter_latency_us (optional)");
  ExpectProfileError(base + ",tflops=3", "unknown field \"tflops\"; fields: flops,");
  ExpectProfileError(base + ",flops=2e12", "field flops is given twice");
  ExpectProfileError("custom:flops=fast,inter_bytes_per_s=1e9,intra_bytes_per_s=1e10",
                     "field flops is \"fast\", not a finite number");
  ExpectProfileError("custom:flops=inf,inter_bytes_per_s=1e9,intra_bytes_per_s=1e10",
                     "field flops is \"inf\", not a finite number");
  ExpectProfileError("custom:flops=1e12,inter_bytes_per_s=0,intra_bytes_per_s=1e10",
                     "field inter_bytes_per_s is 0; it must be in [1, 1e+15]");
  ExpectProfileError(base + ",inter_latency_us=-1",
                     "field inter_latency_us is -1; it must be in [0, 1e+09]");
  ExpectProfileError(base + ",backward_factor=0",
                     "field backward_factor is 0; it must be in (0, 100]");
  ExpectProfileError(base + ",", "item \"\" is not field=value");
  ExpectProfileError("custom:", "item \"\" is not field=value");
  ExpectProfileError("custom:flops", "item \"flops\" is not field=value");
  ExpectProfileError("custom:flops=,inter_bytes_per_s=1e9,intra_bytes_per_s=1e10",
                     "field flops is \"\", not a finite number");
  // The profile is named in every message.
  ExpectProfileError(base + ",x=1", "profile \"" + base + ",x=1\": ");
  ExpectProfileError("tpu",
                     "profile \"tpu\" is unknown; known: h100, h200, cpu-loopback, or "
                     "custom:field=value,... (fields: flops,");
}

TEST(CostModelProfileTest, CanonicalStringRoundTrips) {
  for (const std::string& name : HardwareProfileNames()) {
    const HardwareProfile p = GetHardwareProfile(name);
    const std::string s = CustomProfileString(p);
    absl::StatusOr<HardwareProfile> q = ParseHardwareProfile(s);
    ASSERT_TRUE(q.ok()) << s << ": " << q.status();
    EXPECT_EQ(q->attention_flops, p.attention_flops) << s;
    EXPECT_EQ(q->inter_bytes_per_s, p.inter_bytes_per_s) << s;
    EXPECT_EQ(q->intra_bytes_per_s, p.intra_bytes_per_s) << s;
    EXPECT_EQ(q->inter_latency_s, p.inter_latency_s) << s;
    EXPECT_EQ(q->intra_latency_s, p.intra_latency_s) << s;
    EXPECT_EQ(q->backward_factor, p.backward_factor) << s;
  }
  EXPECT_EQ(CustomProfileString(GetHardwareProfile("h100")),
            "custom:flops=4e+14,inter_bytes_per_s=4.5e+10,intra_bytes_per_s=3.6e+11,"
            "inter_latency_us=15,intra_latency_us=8,backward_factor=2.5");
}

PlanSpec Spec(Strategy strategy, const std::string& profile) {
  PlanSpec spec;
  spec.cu_seqlens = {0, 700, 1000, 2600, 4096};
  spec.total_tokens = 4096;
  spec.topology = {2, 2};
  spec.shape = {8, 2, 64, DType::kBFloat16};
  spec.strategy = strategy;
  spec.profile = profile;
  return spec;
}

// A compile models with the parsed figures: a custom profile with h100's
// figures models exactly h100's times, and doubling every rate (no
// latency) halves every modeled time exactly (a power-of-two scale).
TEST(CostModelProfileTest, CompileUsesTheParsedProfile) {
  const std::string as_h100 = CustomProfileString(GetHardwareProfile("h100"));
  const std::string slow =
      "custom:flops=1e10,inter_bytes_per_s=1e6,intra_bytes_per_s=1e8";
  const std::string fast =
      "custom:flops=2e10,inter_bytes_per_s=2e6,intra_bytes_per_s=2e8";
  for (Strategy s : {Strategy::kRing, Strategy::kUlysses, Strategy::kUsp, Strategy::kSap,
                     Strategy::kHsap}) {
    absl::StatusOr<Plan> named = CompilePlan(Spec(s, "h100"));
    absl::StatusOr<Plan> custom = CompilePlan(Spec(s, as_h100));
    ASSERT_TRUE(named.ok() && custom.ok());
    EXPECT_EQ(custom->spec.profile, as_h100);
    EXPECT_NE(named->key, custom->key);  // the profile is part of the key
    EXPECT_DOUBLE_EQ(custom->stats.modeled_us, named->stats.modeled_us) << StrategyName(s);
    absl::StatusOr<Plan> a = CompilePlan(Spec(s, slow));
    absl::StatusOr<Plan> b = CompilePlan(Spec(s, fast));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_GT(a->stats.modeled_us, 0);
    EXPECT_EQ(b->stats.modeled_us * 2, a->stats.modeled_us) << StrategyName(s);
    EXPECT_EQ(b->stats.lower_bound_us * 2, a->stats.lower_bound_us) << StrategyName(s);
  }
  absl::StatusOr<Plan> bad = CompilePlan(Spec(Strategy::kSap, "custom:flops=1e12"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("field inter_bytes_per_s is missing"),
            std::string::npos)
      << bad.status();
}

// kv_interleave_factor slows a rank's compute by the factor per doubling of
// the KV heads it holds: with free links, a plan whose ranks hold 2 KV heads
// (sap: every head on every rank) models twice the time at 0.5, one whose
// ranks hold 1 (hsap over 2 slots) the same time. It is written only when
// not 1 and round-trips.
TEST(CostModelProfileTest, InterleavedKvHeadsSlowTheRank) {
  const std::string free_links = "custom:flops=1e10,inter_bytes_per_s=1e15,intra_bytes_per_s=1e15";
  const std::string halved = free_links + ",kv_interleave_factor=0.5";
  for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kRing, Strategy::kUlysses}) {
    absl::StatusOr<Plan> a = CompilePlan(Spec(s, free_links));
    absl::StatusOr<Plan> b = CompilePlan(Spec(s, halved));
    ASSERT_TRUE(a.ok() && b.ok()) << StrategyName(s);
    const RankPlan& r = a->ranks[0];
    const double kv_heads = r.kv_head_end - r.kv_head_begin;
    for (const RankPlan& other : a->ranks) {
      ASSERT_EQ(other.kv_head_end - other.kv_head_begin, kv_heads) << StrategyName(s);
    }
    EXPECT_NEAR(b->stats.modeled_us / a->stats.modeled_us, kv_heads, 1e-6) << StrategyName(s);
    if (s == Strategy::kSap) { EXPECT_EQ(kv_heads, 2); }
    if (s == Strategy::kHsap) { EXPECT_EQ(kv_heads, 1); }
  }
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(halved);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kv_interleave_factor, 0.5);
  EXPECT_EQ(ParseHardwareProfile(CustomProfileString(*p))->kv_interleave_factor, 0.5);
  EXPECT_NE(CustomProfileString(*p).find(",kv_interleave_factor=0.5"), std::string::npos);
  EXPECT_EQ(CustomProfileString(*ParseHardwareProfile(free_links)).find("kv_interleave"),
            std::string::npos);
  ExpectProfileError(free_links + ",kv_interleave_factor=0",
                     "field kv_interleave_factor is 0; it must be in (0, 1]");
  ExpectProfileError(free_links + ",kv_interleave_factor=1.5",
                     "field kv_interleave_factor is 1.5; it must be in (0, 1]");
  // auto still models the least of the strategies under it.
  absl::StatusOr<Plan> best_auto = CompilePlan(Spec(Strategy::kAuto, halved));
  ASSERT_TRUE(best_auto.ok());
  double best = 1e300;
  for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                     Strategy::kSap, Strategy::kHsap}) {
    absl::StatusOr<Plan> c = CompilePlan(Spec(s, halved));
    ASSERT_TRUE(c.ok());
    best = std::min(best, c->stats.modeled_us);
  }
  EXPECT_EQ(best_auto->stats.modeled_us, best);
}

// inter_link_ranks k: k ranks of a node share one inter-node link of k
// times a rank's rate. Parsed as an integer in [1, 1024], written only when
// not 1. With compute and the intra-node tier free, a stage's inter-node
// term is the link's bytes at k times the rate: never more than with a link
// per rank (the link's bytes are at most k times its busiest rank's) and
// never less than half of it at k = 2 (at least the rank's own). Where a
// node's ranks move unequal bytes (ulysses with 8 query heads on 16 ranks:
// half of them receive every other rank's share) it models the exchange
// well under the per-rank link's time. The compiler's figures are
// ModelPlanTime's, auto stays the least, the bound stays under the time.
TEST(CostModelProfileTest, SharedInterNodeLink) {
  const std::string links = "custom:flops=1e18,inter_bytes_per_s=1e6,intra_bytes_per_s=1e15";
  const std::string shared = links + ",inter_link_ranks=2";
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(shared);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->inter_link_ranks, 2);
  EXPECT_NE(CustomProfileString(*p).find(",inter_link_ranks=2"), std::string::npos);
  EXPECT_EQ(ParseHardwareProfile(CustomProfileString(*p))->inter_link_ranks, 2);
  EXPECT_EQ(ParseHardwareProfile(links)->inter_link_ranks, 1);
  EXPECT_EQ(CustomProfileString(*ParseHardwareProfile(links)).find("inter_link"), std::string::npos);
  ExpectProfileError(links + ",inter_link_ranks=0", "field inter_link_ranks is 0; it must be in [1, 1024]");
  ExpectProfileError(links + ",inter_link_ranks=1025", "field inter_link_ranks is 1025; it must be in [1, 1024]");
  ExpectProfileError(links + ",inter_link_ranks=1.5", "field inter_link_ranks is 1.5; it must be an integer");
  for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                     Strategy::kSap, Strategy::kHsap}) {
    absl::StatusOr<Plan> one = CompilePlan(Spec(s, links));
    absl::StatusOr<Plan> two = CompilePlan(Spec(s, shared));
    ASSERT_TRUE(one.ok() && two.ok()) << StrategyName(s);
    EXPECT_GT(one->stats.modeled_us, 0) << StrategyName(s);
    EXPECT_LE(two->stats.modeled_us, one->stats.modeled_us * (1 + 1e-12)) << StrategyName(s);
    EXPECT_GE(two->stats.modeled_us, one->stats.modeled_us / 2 * (1 - 1e-12)) << StrategyName(s);
    EXPECT_LE(two->stats.lower_bound_us, two->stats.modeled_us * (1 + 1e-12)) << StrategyName(s);
    Plan again = *two;
    ModelPlanTime(*p, &again);
    EXPECT_EQ(again.stats.modeled_us, two->stats.modeled_us) << StrategyName(s);
    EXPECT_EQ(again.stats.fwd_us, two->stats.fwd_us) << StrategyName(s);
  }
  PlanSpec uneven = Spec(Strategy::kUlysses, links);
  uneven.topology = {8, 2};
  absl::StatusOr<Plan> one = CompilePlan(uneven);
  uneven.profile = shared;
  absl::StatusOr<Plan> two = CompilePlan(uneven);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_LT(two->stats.modeled_us, 0.75 * one->stats.modeled_us)
      << two->stats.modeled_us << " vs " << one->stats.modeled_us;
  absl::StatusOr<Plan> best_auto = CompilePlan(Spec(Strategy::kAuto, shared));
  ASSERT_TRUE(best_auto.ok());
  double best = 1e300;
  for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                     Strategy::kSap, Strategy::kHsap}) {
    best = std::min(best, CompilePlan(Spec(s, shared))->stats.modeled_us);
  }
  EXPECT_EQ(best_auto->stats.modeled_us, best);
}

// auto ranks the candidates with the given profile: its modeled time is
// the lowest of the six strategies compiled under the same custom profile.
TEST(CostModelProfileTest, AutoPlansWithTheCustomProfile) {
  absl::StatusOr<Plan> p = CompilePlan(
      Spec(Strategy::kAuto, "custom:flops=4e14,inter_bytes_per_s=4.5e7,intra_bytes_per_s=3.6e11"));
  ASSERT_TRUE(p.ok()) << p.status();
  double best = 1e300;
  for (Strategy s : {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp,
                     Strategy::kSap, Strategy::kHsap}) {
    absl::StatusOr<Plan> c = CompilePlan(
        Spec(s, "custom:flops=4e14,inter_bytes_per_s=4.5e7,intra_bytes_per_s=3.6e11"));
    ASSERT_TRUE(c.ok());
    best = std::min(best, c->stats.modeled_us);
  }
  EXPECT_EQ(p->stats.modeled_us, best);
}

// A backward stage with returns keeps under its K/V transfer the fewest
// leading home items that cover it and computes the rest while the returns
// fly: the two lists are the forward stage's home items in order, the
// compiler's model is ModelPlanTime's, and it is below the model of the same
// plan with every home item under the transfer (which it was before).
TEST(CostModelProfileTest, BackwardComputesHomeItemsUnderTheReturns) {
  // Compute comparable to the links: home work outlasts the K/V transfer.
  const std::string profile = "custom:flops=2e9,inter_bytes_per_s=1e8,intra_bytes_per_s=1e9";
  const HardwareProfile hw = *ParseHardwareProfile(profile);
  int split = 0;
  // (hsap over several nodes is pipelined: PipelinedHsapModel below.)
  for (Strategy s : {Strategy::kSap, Strategy::kRing, Strategy::kUsp}) {
    absl::StatusOr<Plan> p = CompilePlan(Spec(s, profile));
    ASSERT_TRUE(p.ok()) << p.status();
    Plan before = *p;
    for (size_t r = 0; r < p->ranks.size(); ++r) {
      const RankPlan& rp = p->ranks[r];
      ASSERT_EQ(rp.forward.size(), rp.backward.size());
      for (size_t st = 0; st < rp.backward.size(); ++st) {
        const Stage& f = rp.forward[st];
        const Stage& b = rp.backward[st];
        EXPECT_TRUE(f.return_overlap_items.empty());
        std::vector<WorkItem> joined = b.overlap_items.ToVector();
        for (const WorkItem& w : b.return_overlap_items) joined.push_back(w);
        EXPECT_EQ(joined, f.overlap_items.ToVector()) << StrategyName(s) << " rank " << r;
        if (b.return_overlap_items.empty()) continue;
        ++split;
        EXPECT_FALSE(b.return_sends.empty() && b.return_recvs.empty());
        before.ranks[r].backward[st].overlap_items = f.overlap_items;
        before.ranks[r].backward[st].return_overlap_items = WorkItemList();
      }
    }
    Plan again = *p;
    ModelPlanTime(hw, &again);
    EXPECT_NEAR(again.stats.bwd_us, p->stats.bwd_us, 1e-9 * p->stats.bwd_us) << StrategyName(s);
    ModelPlanTime(hw, &before);
    EXPECT_LE(p->stats.bwd_us, before.stats.bwd_us * (1 + 1e-12)) << StrategyName(s);
    EXPECT_EQ(p->stats.fwd_us, before.stats.fwd_us) << StrategyName(s);
    if (s == Strategy::kSap) {
      EXPECT_LT(p->stats.bwd_us, before.stats.bwd_us) << StrategyName(s);
    }
  }
  EXPECT_GT(split, 0);
}

// hsap over several nodes pipelines its inter-node stage: K chunks in K
// stages and a last stage that moves nothing; stage c >= 1 computes the
// items on chunk c - 1 (overlap_items reading the receive buffer); returns
// ride the exchange two stages later, the last chunk's the last stage's
// return phase; every home item of the first stage's forward list is
// computed once in each pass. The compiler's model is ModelPlanTime's, and
// the plan passes the checker (pairs once, rows read after they land and
// before they are received into again).
// (The compiler keeps the one-stage plan where it models faster: the first
// of these profiles, links slow against compute, gets the pipelined one.)
TEST(CostModelProfileTest, PipelinedHsapModel) {
  std::string profile;
  absl::StatusOr<Plan> p;
  for (const char* bw : {"1e8", "3e7", "1e7", "3e6", "1e6"}) {
    profile = absl::StrCat("custom:flops=2e9,inter_bytes_per_s=", bw, ",intra_bytes_per_s=1e9");
    p = CompilePlan(Spec(Strategy::kHsap, profile));
    ASSERT_TRUE(p.ok()) << p.status();
    if (p->ranks[0].forward.size() > 3) break;
  }
  const HardwareProfile hw = *ParseHardwareProfile(profile);
  // Head scatter, K chunk stages, the last stage, head gather.
  const size_t K = p->ranks[0].forward.size() - 3;
  ASSERT_GE(K, 2u);
  int returns_in_exchange = 0, received_overlap = 0;
  for (const RankPlan& rp : p->ranks) {
    ASSERT_EQ(rp.forward.size(), K + 3);
    ASSERT_EQ(rp.backward.size(), K + 3);
    EXPECT_TRUE(rp.forward[K + 1].sends.empty() && rp.forward[K + 1].recvs.empty());
    int64_t fwd_home = 0, bwd_home = 0;
    for (size_t st = 1; st <= K + 1; ++st) {
      for (const WorkItem& w : rp.forward[st].overlap_items) {
        fwd_home += w.kv_space == RowSpace::kHome ? ItemArea(w) : 0;
        received_overlap += w.kv_space == RowSpace::kRecv;
      }
      for (const Stage* b : {&rp.backward[st]}) {
        for (const WorkItem& w : b->overlap_items) bwd_home += w.kv_space == RowSpace::kHome ? ItemArea(w) : 0;
        bwd_home += ItemsArea(b->return_overlap_items);
        for (const Transfer& t : b->sends) returns_in_exchange += t.payload == Payload::kGradKv;
        if (st <= K) EXPECT_TRUE(b->return_sends.empty() && b->return_recvs.empty());
      }
      EXPECT_TRUE(rp.forward[st].items.empty());
    }
    EXPECT_EQ(fwd_home, bwd_home) << "rank " << rp.rank;
  }
  EXPECT_GT(returns_in_exchange, 0);
  EXPECT_GT(received_overlap, 0);
  Plan again = *p;
  ModelPlanTime(hw, &again);
  EXPECT_NEAR(again.stats.fwd_us, p->stats.fwd_us, 1e-9 * p->stats.fwd_us);
  EXPECT_NEAR(again.stats.bwd_us, p->stats.bwd_us, 1e-9 * p->stats.bwd_us);
  EXPECT_TRUE(CheckCoverage(*p).ok()) << CheckCoverage(*p);
  EXPECT_TRUE(CheckTransfers(*p).ok()) << CheckTransfers(*p);
  EXPECT_TRUE(CheckBudget(*p).ok()) << CheckBudget(*p);
}

// ItemsCovering: the fewest leading items whose compute reaches the time.
TEST(CostModelProfileTest, ItemsCoveringCountsLeadingItems) {
  // 1e3 FLOP/s forward, D = 1, one head: an item of area a takes 4a ms.
  const HardwareProfile hw =
      *ParseHardwareProfile("custom:flops=1e3,inter_bytes_per_s=1,intra_bytes_per_s=1");
  std::vector<WorkItem> v;
  for (int64_t n : {10, 20, 30}) {  // full n x 1 items: areas 10, 20, 30
    WorkItem w;
    w.num_q = n;
    w.num_k = 1;
    v.push_back(w);
  }
  const WorkItemList items(v);
  auto covering = [&](double seconds) {
    return ItemsCovering(hw, 1, 1, 1, /*backward=*/false, seconds, items);
  };
  EXPECT_EQ(covering(0), 0u);
  EXPECT_EQ(covering(0.001), 1u);
  EXPECT_EQ(covering(0.040), 1u);   // exactly the first item
  EXPECT_EQ(covering(0.0401), 2u);
  EXPECT_EQ(covering(0.120), 2u);
  EXPECT_EQ(covering(0.121), 3u);
  EXPECT_EQ(covering(1.0), 3u);     // all of them take less
  // Backward: 2.5 times the FLOPs.
  EXPECT_EQ(ItemsCovering(hw, 1, 1, 1, true, 0.100, items), 1u);
  EXPECT_EQ(ItemsArea(items), 60);
}

}  // namespace
}  // namespace hsap::plan

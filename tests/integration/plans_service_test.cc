// The Plans service over the daemon's Unix socket: dispatch, compile, list
// (with hit counts), show, stats, evict, and precise errors.
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

hsap::v1::PlanSpec Spec() {
  hsap::v1::PlanSpec s;
  for (int64_t x : {0, 100, 100, 700, 1000}) s.add_cu_seqlens(x);
  s.set_causal(true);
  s.set_window(-1);
  s.set_total_tokens(1000);
  s.mutable_topology()->set_num_nodes(2);
  s.mutable_topology()->set_devices_per_node(2);
  s.mutable_shape()->set_num_heads_q(8);
  s.mutable_shape()->set_num_heads_kv(2);
  s.mutable_shape()->set_head_dim(64);
  s.mutable_shape()->set_dtype(hsap::v1::DTYPE_BFLOAT16);
  s.set_strategy(hsap::v1::STRATEGY_SAP);
  s.set_assignment(hsap::v1::ASSIGNMENT_BALANCED);
  s.set_profile("cpu-loopback");
  return s;
}

class PlansServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = testing::StartInProcessDaemon();
    stub_ = hsap::v1::Plans::NewStub(
        grpc::CreateChannel("unix:" + daemon_->socket(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<testing::InProcessDaemon> daemon_;
  std::unique_ptr<hsap::v1::Plans::Stub> stub_;
};

TEST_F(PlansServiceTest, DispatchCoversEveryTokenOnce) {
  grpc::ClientContext ctx;
  hsap::v1::DispatchRequest req;
  *req.mutable_spec() = Spec();
  hsap::v1::DispatchResponse resp;
  ASSERT_TRUE(stub_->Dispatch(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.dispatch().ranks_size(), 4);
  std::vector<int> seen(1000, 0);
  for (const auto& r : resp.dispatch().ranks()) {
    for (const auto& range : r.ranges()) {
      for (int64_t t = range.begin(); t < range.end(); ++t) ++seen[t];
    }
  }
  for (int t = 0; t < 1000; ++t) ASSERT_EQ(seen[t], 1) << "token " << t;
  EXPECT_EQ(resp.strategy(), hsap::v1::STRATEGY_SAP);
  EXPECT_EQ(resp.plan_key().size(), 32u);
  // The inter-node figures: per rank, their busiest and total in the
  // stats, at least the layout's inter-node need, which is more than zero
  // (the 600-token document does not fit in a node's 500) and less than
  // every token's K/V.
  ASSERT_EQ(resp.inter_recv_bytes_per_rank_size(), 4);
  int64_t total = 0, busiest = 0;
  for (int64_t b : resp.inter_recv_bytes_per_rank()) {
    total += b;
    busiest = std::max(busiest, b);
  }
  EXPECT_EQ(resp.stats().total_fwd_bytes_by_tier(1), total);
  EXPECT_EQ(resp.stats().max_fwd_inter_recv_bytes(), busiest);
  EXPECT_GE(total, resp.stats().inter_node_need_bytes());
  const int64_t kappa = 2 * 2 * 64 * 2;  // K and V, Hkv 2, D 64, bf16
  EXPECT_GT(resp.stats().inter_node_need_bytes(), 0);
  EXPECT_LT(resp.stats().inter_node_need_bytes(), 1000 * kappa);
  EXPECT_LE(resp.stats().max_node_inter_need_bytes(), resp.stats().inter_node_need_bytes());
}

TEST_F(PlansServiceTest, CompileListShowEvict) {
  hsap::v1::CompilePlanRequest req;
  *req.mutable_spec() = Spec();
  hsap::v1::CompilePlanResponse first, second;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CompilePlan(&ctx, req, &first).ok());
    EXPECT_FALSE(first.cache_hit());
  }
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CompilePlan(&ctx, req, &second).ok());
    EXPECT_TRUE(second.cache_hit());
    EXPECT_EQ(second.plan_key(), first.plan_key());
  }
  hsap::v1::ListPlansResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ListPlans(&ctx, {}, &list).ok());
  }
  ASSERT_EQ(list.plans_size(), 1);
  EXPECT_EQ(list.plans(0).plan_key(), first.plan_key());
  EXPECT_EQ(list.plans(0).hits(), 1u);
  EXPECT_EQ(list.plans(0).ranks(), 4);
  hsap::v1::ShowPlanRequest show;
  show.set_plan_key(first.plan_key());
  hsap::v1::ShowPlanResponse shown;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ShowPlan(&ctx, show, &shown).ok());
  }
  EXPECT_EQ(shown.plan().plan_key(), first.plan_key());
  EXPECT_EQ(shown.plan().ranks_size(), 4);
  hsap::v1::GetPlanCacheStatsResponse stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetPlanCacheStats(&ctx, {}, &stats).ok());
  }
  EXPECT_EQ(stats.stats().hits(), 1u);
  EXPECT_EQ(stats.stats().misses(), 1u);
  EXPECT_EQ(stats.stats().entries(), 1u);
  hsap::v1::EvictPlansRequest evict;
  evict.add_plan_keys(first.plan_key());
  hsap::v1::EvictPlansResponse evicted;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->EvictPlans(&ctx, evict, &evicted).ok());
  }
  EXPECT_EQ(evicted.evicted(), 1u);
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->ShowPlan(&ctx, show, &shown).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(PlansServiceTest, PreciseErrors) {
  hsap::v1::CompilePlanRequest req;
  *req.mutable_spec() = Spec();
  req.mutable_spec()->mutable_shape()->set_num_heads_kv(3);
  hsap::v1::CompilePlanResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status st = stub_->CompilePlan(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("num_heads_kv"));
  hsap::v1::ShowPlanRequest show;
  show.set_plan_key("xyz");
  hsap::v1::ShowPlanResponse shown;
  grpc::ClientContext ctx2;
  const grpc::Status bad = stub_->ShowPlan(&ctx2, show, &shown);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("plan_key 'xyz'"));
}

}  // namespace
}  // namespace hsap

#include "server/plan/plan_cache.h"

#include <thread>

#include "gtest/gtest.h"

namespace hsap::plan {
namespace {

int64_t CompilePlanBytes(const PlanSpec& spec) {
  PlanCache probe;
  return (*probe.GetOrCompile(spec))->ApproxBytes();
}

// Specs that differ only in the budget: plans of equal size.
PlanSpec Spec(int64_t tag) {
  const int64_t tokens = 100;
  PlanSpec spec;
  spec.recv_buffer_bytes = kDefaultRecvBufferBytes + tag;
  spec.cu_seqlens = {0, tokens / 2, tokens};
  spec.total_tokens = tokens;
  spec.topology = {1, 4};
  spec.shape = {4, 4, 16, DType::kBFloat16};
  spec.strategy = Strategy::kSap;
  return spec;
}

TEST(PlanCacheTest, HitsMissesAndLruEviction) {
  const int64_t one = CompilePlanBytes(Spec(100));
  const int64_t two = CompilePlanBytes(Spec(101)), three = CompilePlanBytes(Spec(102));
  ASSERT_EQ(std::max(two, three), one) << one << " " << two << " " << three;
  PlanCache cache({.max_bytes = 2 * one + one / 2});
  auto a = cache.GetOrCompile(Spec(100));
  ASSERT_TRUE(a.ok());
  auto a2 = cache.GetOrCompile(Spec(100));
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  EXPECT_EQ(cache.Stats().hits, 1);
  EXPECT_EQ(cache.Stats().misses, 1);
  ASSERT_TRUE(cache.GetOrCompile(Spec(101)).ok());
  ASSERT_TRUE(cache.GetOrCompile(Spec(100)).ok());  // 100 becomes most recent
  ASSERT_TRUE(cache.GetOrCompile(Spec(102)).ok());  // evicts 101
  PlanCacheStats s = cache.Stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 3);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.compiles, 3);
  EXPECT_LE(s.bytes, s.max_bytes);
  std::vector<PlanCacheEntry> list = cache.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].key, ComputePlanKey(Spec(102), kPlanFormatVersion));
  EXPECT_EQ(list[1].key, ComputePlanKey(Spec(100), kPlanFormatVersion));
  EXPECT_EQ(list[1].hits, 2);
  const PlanKey gone = ComputePlanKey(Spec(101), kPlanFormatVersion);
  EXPECT_EQ(cache.Show(gone).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache.Evict(gone).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache.Show(list[0].key).ok());
  EXPECT_TRUE(cache.Evict(list[0].key).ok());
  EXPECT_EQ(cache.Stats().entries, 1);
  EXPECT_EQ(cache.Clear(), 1);
  EXPECT_EQ(cache.Stats().bytes, 0);
  // The evicted plan is still valid for its holder.
  EXPECT_EQ((*a)->spec.recv_buffer_bytes, kDefaultRecvBufferBytes + 100);
}

TEST(PlanCacheTest, ErrorsAreNotCached) {
  PlanCache cache;
  PlanSpec bad = Spec(100);
  bad.shape.num_heads_kv = 3;
  auto r = cache.GetOrCompile(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Stats().compile_errors, 1);
  EXPECT_EQ(cache.Stats().entries, 0);
}

TEST(PlanCacheTest, ConcurrentCallersShareOnePlanPerSpec) {
  PlanCache cache;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 50; ++i) {
        auto p = cache.GetOrCompile(Spec(64 + (t + i) % 5));
        ASSERT_TRUE(p.ok());
        ASSERT_EQ((*p)->spec, Spec(64 + (t + i) % 5));
      }
    });
  }
  for (auto& th : threads) th.join();
  PlanCacheStats s = cache.Stats();
  EXPECT_EQ(s.entries, 5);
  EXPECT_EQ(s.hits + s.misses, 400);
  EXPECT_GE(s.compiles, 5);
}

}  // namespace
}  // namespace hsap::plan

// The compile pool (CompileOptions::pool) changes how a plan is computed,
// never what it is. Also run under ThreadSanitizer (scripts/sanitizers.sh).
#include <random>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "server/plan/compiler.h"
#include "tests/sanitizers/sweep.h"

namespace hsap::plan {
namespace {

// From 64 ranks the compiler spreads its per-rank work over a pool: the
// plans must be those of the calling thread alone, bit for bit (stages,
// transfers, segments, work items, statistics, modeled times).
TEST(CompilerPropertyTest, PoolDoesNotChangeThePlan) {
  std::mt19937_64 rng(20261130);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  ThreadPool two(2), three(3);
  int compared = 0, kept = 0;
  for (int c = 0; c < 24; ++c) {
    PlanSpec spec;
    spec.topology = c % 3 == 0 ? Topology{64, 1} : Topology{static_cast<int32_t>(uni(8, 12)), 8};
    const int64_t T = uni(64, 6000);
    spec.total_tokens = T;
    spec.shape.num_heads_kv = static_cast<int32_t>(uni(1, 4));
    spec.shape.num_heads_q = spec.shape.num_heads_kv * static_cast<int32_t>(uni(1, 4));
    spec.shape.head_dim = 8;
    const int64_t kappa = KvRowBytes(spec.shape, spec.shape.num_heads_kv);
    spec.recv_buffer_bytes = uni(0, 2) == 0 ? kappa * uni(64, 512) : kDefaultRecvBufferBytes;
    spec.assignment = static_cast<AssignmentPolicy>(uni(1, 3));
    spec.cu_seqlens.push_back(0);
    for (int64_t x = 0; x < T;) {
      x = std::min(T, x + (uni(0, 9) == 0 ? uni(200, 3000) : uni(0, 120)));
      spec.cu_seqlens.push_back(x);
    }
    spec.causal = uni(0, 4) != 0;
    spec.window = spec.causal && uni(0, 3) == 0 ? uni(0, 300) : -1;
    if (!sweep::Keeps(c, 2)) continue;  // half under ASan, an eighth under TSan
    ++kept;
    for (Strategy s : {Strategy::kSap, Strategy::kHsap, Strategy::kRing, Strategy::kAllGather,
                       Strategy::kUlysses, Strategy::kUsp, Strategy::kAuto}) {
      spec.strategy = s;
      SCOPED_TRACE(::testing::Message() << "case " << c << " strategy " << StrategyName(s)
                                        << " assignment " << AssignmentName(spec.assignment)
                                        << " T " << T << " ranks " << spec.topology.num_ranks());
      absl::StatusOr<Plan> alone = CompilePlan(spec);
      ASSERT_TRUE(alone.ok()) << alone.status();
      for (ThreadPool* pool : {&two, &three}) {
        absl::StatusOr<Plan> pooled = CompilePlan(spec, {.pool = pool});
        ASSERT_TRUE(pooled.ok()) << pooled.status();
        pooled->stats.compile_us = alone->stats.compile_us;  // the only expected difference
        ASSERT_TRUE(*pooled == *alone) << pool->num_threads() << " threads";
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, kept * 7 * 2);
  EXPECT_EQ(kept, sweep::Kept(24, 2));
}

}  // namespace
}  // namespace hsap::plan

// Internal to the compiler: spreading per-rank work over the compile pool.
//
// Every parallel loop of the compiler writes only state owned by its index
// (one rank, one virtual rank, one attempt) and reduces afterwards in index
// order, so a plan is the same, bit for bit, whatever the pool
// (compiler_test: PoolDoesNotChangeThePlan).
#ifndef HSAP_SERVER_PLAN_PARALLEL_H_
#define HSAP_SERVER_PLAN_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "common/thread_pool.h"

namespace hsap::plan::internal {

// Ranks below which a compilation stays on the calling thread: waking the
// pool costs more than the per-rank work it would share.
inline constexpr int32_t kParallelMinRanks = 64;

// Calls fn(i) for every i in [0, n): over `pool` when it is set, in index
// order on this thread otherwise. Not reentrant (ThreadPool::ParallelFor):
// fn must not call ForEachIndex with the same pool.
// Indices go to the threads in runs of consecutive ones (about sixteen runs
// per thread, still handed out dynamically): neighbouring indices share
// cache lines (their output slots, a head group's inner-level lists), and a
// thread that owns a run keeps them instead of bouncing them between cores.
inline void ForEachIndex(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool == nullptr || pool->num_threads() <= 1 || n < 2) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, n / (int64_t{16} * pool->num_threads()));
  const int64_t runs = (n + grain - 1) / grain;
  pool->ParallelFor(runs, [&](int64_t r) {
    const int64_t end = std::min(n, (r + 1) * grain);
    for (int64_t i = r * grain; i < end; ++i) fn(i);
  });
}

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_PARALLEL_H_

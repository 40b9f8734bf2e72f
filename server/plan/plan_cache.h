// The plan cache: compiled plans by key, LRU bounded in bytes.
//
// Thread-safe. Lookups hash the spec (plan_key.h) and, on a hit, compare the
// stored spec with the request (a 128-bit collision can then never return a
// wrong plan). Compilation runs outside the lock, so concurrent misses on
// different specs compile in parallel; two misses on the same spec may both
// compile, and the first to insert wins (plans are deterministic, so both
// are equal). Plans are shared as std::shared_ptr<const Plan>: eviction never
// invalidates a plan a caller still holds.
//
// Example:
//   PlanCache cache({.max_bytes = 512 << 20});
//   HSAP_ASSIGN_OR_RETURN(std::shared_ptr<const Plan> plan, cache.GetOrCompile(spec));
#ifndef HSAP_SERVER_PLAN_PLAN_CACHE_H_
#define HSAP_SERVER_PLAN_PLAN_CACHE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_pool.h"
#include "server/plan/plan.h"

namespace hsap::plan {

struct PlanCacheOptions {
  // Sum of Plan::ApproxBytes() kept; a plan larger than this is returned but
  // not cached.
  int64_t max_bytes = int64_t{1} << 30;
  // Threads of the cache's compile pool (CompileOptions::pool, used from 64
  // ranks); 1: misses compile on the calling thread only. The plans are the
  // same either way.
  int compile_threads = 1;
};

struct PlanCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;  // by the byte bound (explicit Evict() not counted)
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t max_bytes = 0;
  int64_t compiles = 0;           // successful compilations
  int64_t compile_errors = 0;     // specs rejected
  int64_t compile_us_total = 0;
  int64_t compile_us_max = 0;
};

// What List() shows of one entry.
struct PlanCacheEntry {
  PlanKey key;
  Strategy strategy = Strategy::kSap;  // what runs
  Strategy requested = Strategy::kAuto;
  AssignmentPolicy assignment = AssignmentPolicy::kBalanced;
  int32_t num_ranks = 0;
  int64_t total_tokens = 0;
  int64_t bytes = 0;
  int64_t hits = 0;
  int64_t compile_us = 0;
  double modeled_us = 0;
};

class PlanCache {
 public:
  explicit PlanCache(PlanCacheOptions options = {});
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The plan of `spec`: cached, or compiled (CompilePlan) and inserted.
  // `*hit` (may be null) says whether this call found it cached (a compile
  // that lost a race to an identical one is not a hit). Errors are
  // CompilePlan's (INVALID_ARGUMENT naming the field).
  // `stop` (may be null) is the compile's CompileOptions::stop.
  absl::StatusOr<std::shared_ptr<const Plan>> GetOrCompile(
      const PlanSpec& spec, bool* hit = nullptr, const std::function<bool()>* stop = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The cached plan with `key` (NOT_FOUND otherwise). Does not count as a
  // hit or change the LRU order: this is the operator's view.
  absl::StatusOr<std::shared_ptr<const Plan>> Show(const PlanKey& key) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Entries, most recently used first.
  std::vector<PlanCacheEntry> List() const ABSL_LOCKS_EXCLUDED(mu_);

  // Removes `key`; NOT_FOUND when absent.
  absl::Status Evict(const PlanKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes everything; returns how many entries were removed.
  int64_t Clear() ABSL_LOCKS_EXCLUDED(mu_);

  PlanCacheStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<const Plan> plan;
    int64_t bytes = 0;
    int64_t hits = 0;
  };
  using List_ = std::list<Entry>;

  void EvictToFitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PlanCacheOptions options_;
  std::unique_ptr<ThreadPool> compile_pool_;  // null with compile_threads <= 1
  mutable absl::Mutex mu_;
  List_ lru_ ABSL_GUARDED_BY(mu_);  // front = most recently used
  absl::flat_hash_map<PlanKey, List_::iterator> index_ ABSL_GUARDED_BY(mu_);
  PlanCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_CACHE_H_

#include "server/plan/plan_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/plan/compiler.h"

namespace hsap::plan {

PlanCache::PlanCache(PlanCacheOptions options) : options_(options) {
  stats_.max_bytes = options_.max_bytes;
  if (options_.compile_threads > 1) {
    compile_pool_ = std::make_unique<ThreadPool>(options_.compile_threads);
  }
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanCache::GetOrCompile(
    const PlanSpec& spec, bool* hit, const std::function<bool()>* stop) {
  if (hit != nullptr) *hit = false;
  const PlanKey key = ComputePlanKey(spec, kPlanFormatVersion);
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end() && it->second->plan->spec == spec) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++it->second->hits;
      ++stats_.hits;
      if (hit != nullptr) *hit = true;
      return it->second->plan;
    }
    ++stats_.misses;
  }
  absl::StatusOr<Plan> compiled = CompilePlan(spec, {.pool = compile_pool_.get(), .stop = stop});
  absl::MutexLock lock(&mu_);
  if (!compiled.ok()) {
    ++stats_.compile_errors;
    return compiled.status();
  }
  ++stats_.compiles;
  stats_.compile_us_total += compiled->stats.compile_us;
  stats_.compile_us_max = std::max(stats_.compile_us_max, compiled->stats.compile_us);
  auto plan = std::make_shared<const Plan>(*std::move(compiled));
  auto it = index_.find(key);
  if (it != index_.end()) {
    if (it->second->plan->spec == spec) return it->second->plan;  // a racing miss won
    return plan;  // a hash collision: serve without caching
  }
  const int64_t bytes = plan->ApproxBytes();
  if (bytes > options_.max_bytes) return plan;
  lru_.push_front(Entry{plan, bytes, 0});
  index_[key] = lru_.begin();
  stats_.bytes += bytes;
  stats_.entries = static_cast<int64_t>(lru_.size());
  EvictToFitLocked();
  return plan;
}

void PlanCache::EvictToFitLocked() {
  while (stats_.bytes > options_.max_bytes && !lru_.empty()) {
    const Entry& victim = lru_.back();
    stats_.bytes -= victim.bytes;
    index_.erase(victim.plan->key);
    lru_.pop_back();
    ++stats_.evictions;
  }
  stats_.entries = static_cast<int64_t>(lru_.size());
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanCache::Show(const PlanKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("plan ", key.ToHex(), " is not in the cache"));
  }
  return it->second->plan;
}

std::vector<PlanCacheEntry> PlanCache::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<PlanCacheEntry> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) {
    const Plan& p = *e.plan;
    out.push_back({p.key, p.strategy, p.spec.strategy, p.spec.assignment,
                   p.spec.topology.num_ranks(), p.spec.total_tokens, e.bytes, e.hits,
                   p.stats.compile_us, p.stats.modeled_us});
  }
  return out;
}

absl::Status PlanCache::Evict(const PlanKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("plan ", key.ToHex(), " is not in the cache"));
  }
  stats_.bytes -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  stats_.entries = static_cast<int64_t>(lru_.size());
  return absl::OkStatus();
}

int64_t PlanCache::Clear() {
  absl::MutexLock lock(&mu_);
  const int64_t n = static_cast<int64_t>(lru_.size());
  lru_.clear();
  index_.clear();
  stats_.bytes = 0;
  stats_.entries = 0;
  return n;
}

PlanCacheStats PlanCache::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace hsap::plan

#include "kernels/cpu/scratch.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <new>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "hwy/aligned_allocator.h"

namespace hsap::kernels::cpu::internal {
namespace {

// Highway's allocator (malloc underneath, aligned by offset), as the
// kernels' scratch always used: hsapd's allocation pattern stays the one
// tests/integration/load_test.cc checks for growth.
float* AllocateFloats(size_t n) {
  return static_cast<float*>(hwy::AllocateAlignedBytes(n * sizeof(float), nullptr, nullptr));
}

void FreeFloats(float* p) { hwy::FreeAlignedBytes(p, nullptr, nullptr); }

// Free blocks, oldest first.
class Cache {
 public:
  // A free block of at least n floats and at most twice that (a larger one
  // would hold memory the call does not use); the smallest such. Null when
  // none.
  float* Take(size_t n, size_t* capacity) {
    absl::MutexLock lock(&mu_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first >= n && it->first / 2 <= n &&
          (best == free_.end() || it->first < best->first)) {
        best = it;
      }
    }
    if (best == free_.end()) return nullptr;
    float* p = best->second;
    *capacity = best->first;
    cached_bytes_ -= best->first * sizeof(float);
    free_.erase(best);
    return p;
  }

  // Takes the block (capacity floats) into the cache and evicts the oldest
  // blocks beyond the limit; a block larger than the limit is freed and
  // leaves the cache as it was.
  void Give(float* p, size_t capacity) {
    std::deque<std::pair<size_t, float*>> evicted;
    {
      absl::MutexLock lock(&mu_);
      if (capacity * sizeof(float) > limit_) {
        evicted.emplace_back(capacity, p);
      } else {
        free_.emplace_back(capacity, p);
        cached_bytes_ += capacity * sizeof(float);
        Evict(&evicted);
      }
    }
    for (const auto& [c, q] : evicted) FreeFloats(q);
  }

  void SetLimit(size_t bytes) {
    std::deque<std::pair<size_t, float*>> evicted;
    {
      absl::MutexLock lock(&mu_);
      limit_ = bytes;
      Evict(&evicted);
    }
    for (const auto& [c, q] : evicted) FreeFloats(q);
  }

  size_t limit() {
    absl::MutexLock lock(&mu_);
    return limit_;
  }

  size_t cached_bytes() {
    absl::MutexLock lock(&mu_);
    return cached_bytes_;
  }

 private:
  void Evict(std::deque<std::pair<size_t, float*>>* evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (cached_bytes_ > limit_) {
      cached_bytes_ -= free_.front().first * sizeof(float);
      evicted->push_back(free_.front());
      free_.pop_front();
    }
  }

  absl::Mutex mu_;
  std::deque<std::pair<size_t, float*>> free_ ABSL_GUARDED_BY(mu_);
  size_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t limit_ ABSL_GUARDED_BY(mu_) = kDefaultScratchCacheBytes;
};

Cache& TheCache() {
  static Cache* cache = new Cache;  // never destroyed: calls may end at exit
  return *cache;
}

}  // namespace

void ScratchDeleter::operator()(float* p) const {
  if (p == nullptr) return;
  if (kScratchCacheEnabled && capacity * sizeof(float) >= kMinCachedScratchBytes) {
    TheCache().Give(p, capacity);
  } else {
    FreeFloats(p);
  }
}

ScratchPtr Scratch(size_t n) {
  n = std::max<size_t>(n, 1);
  size_t capacity = n;
  float* p = nullptr;
  if (kScratchCacheEnabled && n * sizeof(float) >= kMinCachedScratchBytes) {
    p = TheCache().Take(n, &capacity);
  }
  if (p == nullptr) {
    p = AllocateFloats(n);
    capacity = n;
    if (p == nullptr) throw std::bad_alloc();
  }
#if defined(ADDRESS_SANITIZER) || defined(THREAD_SANITIZER)
  std::fill(p, p + capacity, std::numeric_limits<float>::quiet_NaN());
#endif
  return ScratchPtr(p, ScratchDeleter{capacity});
}

size_t CachedScratchBytes() { return TheCache().cached_bytes(); }
size_t ScratchCacheLimit() { return TheCache().limit(); }

void SetScratchCacheLimit(size_t bytes) { TheCache().SetLimit(bytes); }

}  // namespace hsap::kernels::cpu::internal

#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hsap {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPoolTest, UsesMoreThanOneThread) {
  ThreadPool pool(2);
  std::atomic<int> inside{0}, max_inside{0};
  pool.ParallelFor(64, [&](int64_t) {
    const int now = inside.fetch_add(1) + 1;
    int seen = max_inside.load();
    while (now > seen && !max_inside.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    inside.fetch_sub(1);
  });
  EXPECT_EQ(max_inside.load(), 2);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialisedAndComplete) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        pool.ParallelFor(100, [&](int64_t i) { total.fetch_add(i); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * (99 * 100 / 2));
}

// First come, first served: a caller that arrives while another keeps the
// pool busy job after job waits for the job ahead of it, not for the other
// caller to stop. The hog's jobs take ~20 ms (sleeps), so the few jobs of
// slack below cover a descheduled test thread, not a scheduling order; an
// unfair lock lets the hog, which re-enters at once, take it again and again.
TEST(ThreadPoolTest, ACallerWaitsOnlyForTheJobAheadOfIt) {
  ThreadPool pool(2);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> hog_jobs{0};
  std::thread hog([&] {
    while (!stop.load()) {
      pool.ParallelFor(4, [](int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); });
      hog_jobs.fetch_add(1);
    }
  });
  while (hog_jobs.load() < 2) std::this_thread::yield();
  int64_t worst = 0;
  for (int rep = 0; rep < 20; ++rep) {
    const int64_t before = hog_jobs.load();
    std::atomic<int64_t> sum{0};
    pool.ParallelFor(8, [&](int64_t i) { sum.fetch_add(i); });
    worst = std::max(worst, hog_jobs.load() - before);
    ASSERT_EQ(sum.load(), 28);
  }
  stop.store(true);
  hog.join();
  EXPECT_LE(worst, 3) << "the small caller waited for " << worst << " of the hog's jobs";
}

TEST(ThreadPoolTest, NonPositiveSizeMeansCallerOnly) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t sum = 0;  // no synchronisation needed: the caller runs everything
  pool.ParallelFor(10, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum, 45);
}

}  // namespace
}  // namespace hsap

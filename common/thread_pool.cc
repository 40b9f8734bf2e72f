#include "common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace hsap {

// One ParallelFor at a time, callers served in arrival order (a ticket
// queue: a caller that waits gets the pool after the job in progress, never
// after later arrivals — the kernels' fair share between calls). Indices are
// handed out through an
// atomic counter, so cheap and expensive indices balance dynamically; the
// caller works too and then waits until every worker has left the job.
struct ThreadPool::State {
  int num_threads = 1;
  std::vector<std::thread> workers;

  // Serialises ParallelFor callers, first come first served.
  std::mutex call_mu;
  std::condition_variable call_cv;
  uint64_t next_ticket = 0;  // guarded by call_mu
  uint64_t serving = 0;      // guarded by call_mu

  std::mutex mu;
  std::condition_variable work_cv;  // workers wait here for a new generation
  std::condition_variable done_cv;  // the caller waits here for busy == 0
  uint64_t generation = 0;          // guarded by mu
  bool stop = false;                // guarded by mu
  int busy = 0;                     // workers inside the current job, guarded by mu

  // The current job; written under mu before generation is bumped.
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  // Lock-free mirrors of generation and busy, read only by Spin: a thread
  // about to sleep first watches them for a few microseconds, because a
  // kernel call runs one short job after another (waves of a few ms, one
  // barrier each) and a futex wake-up costs tens of microseconds on a VM.
  std::atomic<uint64_t> published{0};
  std::atomic<int> running{0};

  // Returns when done() holds or after about kSpin, whichever is first;
  // the caller then waits on its condition variable as before (which
  // rechecks under mu), so spinning changes only how soon a thread notices.
  static constexpr std::chrono::microseconds kSpin{50};
  template <typename Done>
  static void Spin(Done done) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
      for (int i = 0; i < 16; ++i) {
        if (done()) return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
      if (std::chrono::steady_clock::now() >= until) return;
    }
  }

  void RunJob(const std::function<void(int64_t)>& job, int64_t count) {
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= count) return;
      job(i);
    }
  }

  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* job;
      int64_t count;
      Spin([&] { return published.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> lock(mu);
        work_cv.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        // A worker that wakes after its job ended sees fn == nullptr (or the
        // next job, which it then joins): the snapshot is taken under mu.
        job = fn;
        count = n;
        if (job == nullptr) continue;
        ++busy;
        running.fetch_add(1, std::memory_order_relaxed);
      }
      RunJob(*job, count);
      {
        std::lock_guard<std::mutex> lock(mu);
        running.fetch_sub(1, std::memory_order_release);
        if (--busy == 0) done_cv.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : state_(new State) {
  state_->num_threads = num_threads < 1 ? 1 : num_threads;
  for (int i = 1; i < state_->num_threads; ++i) {
    state_->workers.emplace_back([s = state_] { s->WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (std::thread& t : state_->workers) t.join();
  delete state_;
}

int ThreadPool::num_threads() const { return state_->num_threads; }

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  State& s = *state_;
  if (s.workers.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::unique_lock<std::mutex> call_lock(s.call_mu);
    const uint64_t ticket = s.next_ticket++;
    s.call_cv.wait(call_lock, [&] { return s.serving == ticket; });
  }
  struct Release {
    State& s;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(s.call_mu);
        ++s.serving;
      }
      s.call_cv.notify_all();
    }
  } release{s};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = &fn;
    s.n = n;
    s.next.store(0, std::memory_order_relaxed);
    ++s.generation;
    s.published.store(s.generation, std::memory_order_release);
  }
  s.work_cv.notify_all();
  s.RunJob(fn, n);
  State::Spin([&] { return s.running.load(std::memory_order_acquire) == 0; });
  // Waiting for busy == 0 guarantees no worker still holds a reference to fn;
  // clearing fn under mu keeps late wakers away from it.
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.busy == 0; });
  s.fn = nullptr;
}

}  // namespace hsap

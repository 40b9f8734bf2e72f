// A fixed-size pool of worker threads. The daemon owns one for the CPU
// kernels of each CPU device slot (--cpu_threads) and one for the plan
// compiler (--plan_compile_threads).
#ifndef HSAP_COMMON_THREAD_POOL_H_
#define HSAP_COMMON_THREAD_POOL_H_

#include <cstdint>
#include <functional>

namespace hsap {

class ThreadPool {
 public:
  // Starts `num_threads - 1` workers; the calling thread of ParallelFor is
  // the last one. num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const;

  // Calls fn(i) for every i in [0, n), spread over the threads, and returns
  // when all calls have returned. Threads that run out of work watch for
  // the next job (or the caller for the workers' end) for up to 50 us
  // before they sleep (thread_pool.cc). Not reentrant: fn must not call
  // ParallelFor on the same pool. Thread-safe: concurrent callers are
  // serialised in the order they arrived (first come, first served).
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  struct State;
  State* state_;
};

}  // namespace hsap

#endif  // HSAP_COMMON_THREAD_POOL_H_

// PollBackoff: the sleep between two polls of something that completes
// asynchronously (an NCCL communicator's state, a CUDA event). It starts at
// a few microseconds, so a short exchange is noticed quickly, and doubles up
// to a cap, so a long one does not burn a core; it never sleeps past the
// deadline it is given.
//
//   PollBackoff backoff;
//   while (!done()) {
//     if (absl::Now() >= deadline) return DeadlineExceeded(...);
//     backoff.Sleep(deadline);
//   }
#ifndef HSAP_SERVER_GPU_POLL_BACKOFF_H_
#define HSAP_SERVER_GPU_POLL_BACKOFF_H_

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hsap::gpu {

class PollBackoff {
 public:
  explicit PollBackoff(absl::Duration first = absl::Microseconds(2),
                       absl::Duration cap = absl::Microseconds(500))
      : next_(first), cap_(cap) {}

  // Sleeps for the next interval, cut short at `deadline`.
  void Sleep(absl::Time deadline) {
    const absl::Duration left = deadline - absl::Now();
    if (left > absl::ZeroDuration()) absl::SleepFor(std::min(next_, left));
    next_ = std::min(next_ * 2, cap_);
  }

 private:
  absl::Duration next_;
  const absl::Duration cap_;
};

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_POLL_BACKOFF_H_

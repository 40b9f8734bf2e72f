// Admission of calls and graceful drain: while open, Enter() admits calls
// and counts them; Close() refuses new ones (UNAVAILABLE) and WaitIdle()
// waits for those in flight. Thread-safe.
#ifndef HSAP_SERVER_EXEC_CALL_GATE_H_
#define HSAP_SERVER_EXEC_CALL_GATE_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hsap {

class CallGate {
 public:
  // RAII admission ticket; leaving the scope ends the call.
  class Ticket {
   public:
    explicit Ticket(CallGate* gate) : gate_(gate) {}
    Ticket(Ticket&& o) noexcept : gate_(o.gate_) { o.gate_ = nullptr; }
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket() {
      if (gate_ != nullptr) gate_->Leave();
    }

   private:
    CallGate* gate_;
  };

  // UNAVAILABLE once Close() was called.
  absl::Status Enter() {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::UnavailableError("hsapd is draining: it accepts no new calls");
    ++in_flight_;
    return absl::OkStatus();
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // True when no call is in flight by `deadline`.
  bool WaitIdle(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithDeadline(absl::Condition(this, &CallGate::Idle), deadline);
  }
  int in_flight() const {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }
  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; }
  void Leave() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_CALL_GATE_H_

// Admission control for call memory: one daemon-wide budget of bytes
// (`hsapd --memory_budget_bytes`) from which every rank's run reserves what
// its layout needs (accumulators, home rows, receive and staging buffers)
// before anything is allocated, and releases it when the run ends. A call
// that does not fit is RESOURCE_EXHAUSTED naming its need and the budget,
// instead of growing the daemon towards the OOM killer.
//
// Thread-safe.
#ifndef HSAP_SERVER_EXEC_MEMORY_BUDGET_H_
#define HSAP_SERVER_EXEC_MEMORY_BUDGET_H_

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace hsap::exec {

class MemoryBudget {
 public:
  // `limit` bytes (>= 0).
  explicit MemoryBudget(int64_t limit) : limit_(limit) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes held until destruction (move-only).
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept
        : budget_(std::exchange(o.budget_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    Reservation& operator=(Reservation&& o) noexcept {
      if (this != &o) {
        Release();
        budget_ = std::exchange(o.budget_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    ~Reservation() { Release(); }
    int64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, int64_t bytes) : budget_(budget), bytes_(bytes) {}
    void Release();
    MemoryBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // Reserves `bytes` for `what` ("rank 3's forward", ...). RESOURCE_EXHAUSTED
  // "<what> needs N bytes but the memory budget (--memory_budget_bytes = L)
  // has F free" when it does not fit; INVALID_ARGUMENT for negative bytes.
  absl::StatusOr<Reservation> Reserve(int64_t bytes, absl::string_view what);

  int64_t limit() const { return limit_; }
  int64_t reserved() const;

 private:
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// The default budget: half of the machine's physical memory.
int64_t DefaultMemoryBudgetBytes();

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_MEMORY_BUDGET_H_

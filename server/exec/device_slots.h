// The node's device slots (`hsapd --devices=cpu:N`): one compute backend per
// slot, each with its own resources (the CPU backend: its own thread pool),
// so that ranks on different slots compute at the same time.
//
// Which slot a rank runs on: the ranks of a group that has several ranks on
// this node take the slots in local-rank order (local rank i -> slot i mod
// N); a group with one rank here takes the least busy slot (fewest runs on
// it now, the lowest index on a tie). Slots are not exclusive: two runs on
// one slot take turns in its kernels (the CPU backend's pool serialises
// its callers), which is always safe because a run never blocks inside a
// kernel call.
//
// Thread-safety: thread-safe.
#ifndef HSAP_SERVER_EXEC_DEVICE_SLOTS_H_
#define HSAP_SERVER_EXEC_DEVICE_SLOTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/exec/compute_backend.h"

namespace hsap::exec {

class DeviceSlots {
 public:
  // `backends[i]` serves slot i, named `names[i]` ("cpu:0", ...).
  DeviceSlots(std::vector<std::unique_ptr<ComputeBackend>> backends,
              std::vector<std::string> names);
  // `slots` CPU slots, each with a pool of `threads_per_slot` threads, all
  // reserving call memory from `budget` (may be null; must outlive them).
  // paced_flops_per_s > 0: each slot's attention kernels are held to that
  // rate (paced_backend.h; the emulated cluster's compute cap).
  static std::unique_ptr<DeviceSlots> Cpu(int slots, int threads_per_slot,
                                          MemoryBudget* budget = nullptr,
                                          double paced_flops_per_s = 0);

  int size() const { return static_cast<int>(backends_.size()); }
  const std::vector<std::string>& names() const { return names_; }

  // A slot held for one rank's run; released on destruction.
  class Lease {
   public:
    Lease(Lease&& o) noexcept : slots_(o.slots_), slot_(o.slot_) { o.slots_ = nullptr; }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    int slot() const { return slot_; }
    ComputeBackend* backend() const;

   private:
    friend class DeviceSlots;
    Lease(DeviceSlots* slots, int slot) : slots_(slots), slot_(slot) {}
    DeviceSlots* slots_;
    int slot_;
  };

  // The slot for local rank `local_index` of a group with `local_ranks`
  // ranks on this node (rule above).
  Lease Acquire(int local_index, int local_ranks);
  // Runs on each slot now (for tests and status pages).
  std::vector<int> busy() const;
  // Adds `seconds` of kernel time to slot `slot`'s total; the totals.
  void RecordBusy(int slot, double seconds);
  std::vector<double> busy_seconds() const;

 private:
  std::vector<std::unique_ptr<ComputeBackend>> backends_;
  std::vector<std::string> names_;
  mutable absl::Mutex mu_;
  std::vector<int> busy_ ABSL_GUARDED_BY(mu_);
  std::vector<double> busy_seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_DEVICE_SLOTS_H_

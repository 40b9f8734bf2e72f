#include "server/exec/device_slots.h"

#include "absl/strings/str_cat.h"
#include "server/exec/cpu_backend.h"
#include "server/exec/paced_backend.h"

namespace hsap::exec {

DeviceSlots::DeviceSlots(std::vector<std::unique_ptr<ComputeBackend>> backends,
                         std::vector<std::string> names)
    : backends_(std::move(backends)),
      names_(std::move(names)),
      busy_(backends_.size(), 0),
      busy_seconds_(backends_.size(), 0.0) {}

std::unique_ptr<DeviceSlots> DeviceSlots::Cpu(int slots, int threads_per_slot,
                                              MemoryBudget* budget,
                                              double paced_flops_per_s) {
  std::vector<std::unique_ptr<ComputeBackend>> backends;
  std::vector<std::string> names;
  for (int i = 0; i < std::max(1, slots); ++i) {
    std::unique_ptr<ComputeBackend> cpu =
        std::make_unique<CpuBackend>(std::max(1, threads_per_slot), budget);
    if (paced_flops_per_s > 0) {
      cpu = std::make_unique<PacedBackend>(std::move(cpu), paced_flops_per_s);
    }
    backends.push_back(std::move(cpu));
    names.push_back(absl::StrCat("cpu:", i));
  }
  return std::make_unique<DeviceSlots>(std::move(backends), std::move(names));
}

DeviceSlots::Lease::~Lease() {
  if (slots_ == nullptr) return;
  absl::MutexLock lock(&slots_->mu_);
  --slots_->busy_[slot_];
}

ComputeBackend* DeviceSlots::Lease::backend() const { return slots_->backends_[slot_].get(); }

DeviceSlots::Lease DeviceSlots::Acquire(int local_index, int local_ranks) {
  absl::MutexLock lock(&mu_);
  const int n = size();
  int slot = 0;
  if (local_ranks > 1) {
    slot = ((local_index % n) + n) % n;
  } else {
    for (int i = 1; i < n; ++i) {
      if (busy_[i] < busy_[slot]) slot = i;
    }
  }
  ++busy_[slot];
  return Lease(this, slot);
}

std::vector<int> DeviceSlots::busy() const {
  absl::MutexLock lock(&mu_);
  return busy_;
}

void DeviceSlots::RecordBusy(int slot, double seconds) {
  absl::MutexLock lock(&mu_);
  if (slot >= 0 && slot < size()) busy_seconds_[slot] += seconds;
}

std::vector<double> DeviceSlots::busy_seconds() const {
  absl::MutexLock lock(&mu_);
  return busy_seconds_;
}

}  // namespace hsap::exec

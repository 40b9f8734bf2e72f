#include "server/exec/memory_budget.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace hsap::exec {

void MemoryBudget::Reservation::Release() {
  if (budget_ == nullptr) return;
  absl::MutexLock lock(&budget_->mu_);
  budget_->reserved_ -= bytes_;
  budget_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(int64_t bytes,
                                                                absl::string_view what) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " needs ", bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (bytes > limit_ - reserved_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", bytes, " bytes of call memory but the memory budget "
        "(--memory_budget_bytes = ", limit_, ") has ", limit_ - reserved_, " free"));
  }
  reserved_ += bytes;
  return Reservation(this, bytes);
}

int64_t MemoryBudget::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

int64_t DefaultMemoryBudgetBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return int64_t{8} << 30;
  return static_cast<int64_t>(pages) * page / 2;
}

}  // namespace hsap::exec

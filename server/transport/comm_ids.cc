#include "server/transport/comm_ids.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/transport/ucx_tag.h"

namespace hsap::transport {

struct CommIdAllocator::Table {
  explicit Table(uint32_t n) : capacity(n) {
    for (uint32_t id = 0; id < n; ++id) free_ids.push_back(id);
  }
  const uint32_t capacity;
  mutable absl::Mutex mu;
  std::deque<uint32_t> free_ids ABSL_GUARDED_BY(mu);  // front: freed longest ago
};

CommIdAllocator::CommIdAllocator(uint32_t capacity)
    : table_(std::make_shared<Table>(std::clamp<uint32_t>(capacity, 1, ucx_tag::kMaxComms))) {}

absl::StatusOr<CommIdAllocator::Lease> CommIdAllocator::Allocate() {
  absl::MutexLock lock(&table_->mu);
  if (table_->free_ids.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", table_->capacity,
        " UCX communicator ids of this node are held by multi-node calls in flight (the limit "
        "is ",
        table_->capacity, " live multi-node calls per node: ", ucx_tag::kCommBits,
        " comm bits of the UCP tag); retry when calls have finished"));
  }
  const uint32_t id = table_->free_ids.front();
  table_->free_ids.pop_front();
  return Lease(table_, id);
}

uint32_t CommIdAllocator::live() const {
  absl::MutexLock lock(&table_->mu);
  return table_->capacity - static_cast<uint32_t>(table_->free_ids.size());
}

uint32_t CommIdAllocator::capacity() const { return table_->capacity; }

CommIdAllocator::Lease::Lease(Lease&& other) noexcept
    : table_(std::move(other.table_)), id_(other.id_) {
  other.table_ = nullptr;
}

CommIdAllocator::Lease& CommIdAllocator::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::move(other.table_);
    id_ = other.id_;
    other.table_ = nullptr;
  }
  return *this;
}

void CommIdAllocator::Lease::Release() {
  if (table_ == nullptr) return;
  {
    absl::MutexLock lock(&table_->mu);
    table_->free_ids.push_back(id_);
  }
  table_ = nullptr;
}

}  // namespace hsap::transport

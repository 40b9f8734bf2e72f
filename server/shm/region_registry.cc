#include "server/shm/region_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace hsap::shm {

RegionPin& RegionPin::operator=(RegionPin&& other) noexcept {
  if (this != &other) {
    Release();
    registry_ = other.registry_;
    id_ = other.id_;
    mapping_ = std::move(other.mapping_);
    other.registry_ = nullptr;
    other.id_ = 0;
  }
  return *this;
}

void RegionPin::Release() {
  if (registry_ != nullptr) registry_->Unpin(id_);
  registry_ = nullptr;
  mapping_.reset();  // may unmap, if the session was dropped meanwhile
}

absl::Status RegionPin::CheckIntact() const {
  if (mapping_ == nullptr) return absl::OkStatus();
  return mapping_->CheckIntact(absl::StrCat("region ", id_));
}

absl::Status RegionRegistry::Refuse(const char* flag, std::string message) const {
  if (on_refusal_) on_refusal_(flag);
  return absl::ResourceExhaustedError(absl::StrCat(message, " (--", flag, ")"));
}

absl::Status RegionRegistry::CheckAdmission(uint64_t session, uint64_t size) const {
  absl::MutexLock lock(&mu_);
  return CheckAdmissionLocked(session, size);
}

absl::Status RegionRegistry::CheckAdmissionLocked(uint64_t session, uint64_t size) const {
  auto it = sessions_.find(session);
  const uint64_t count = it == sessions_.end() ? 0 : it->second.ids.size();
  const uint64_t bytes = it == sessions_.end() ? 0 : it->second.bytes;
  if (count >= limits_.max_regions_per_session) {
    return Refuse("max_regions_per_session",
                  absl::StrCat("session ", session, " already has ", count,
                               " regions, the limit per session"));
  }
  if (entries_.size() >= limits_.max_regions) {
    return Refuse("max_regions", absl::StrCat("the daemon already holds ", entries_.size(),
                                              " regions, the limit across sessions"));
  }
  const uint64_t mappings = live_mappings_.load(std::memory_order_relaxed);
  if (mappings >= limits_.max_mappings) {
    return Refuse("max_region_mappings",
                  absl::StrCat("the daemon already holds ", mappings,
                               " client mappings (regions, and unregistered ones calls still "
                               "use), the limit that keeps headroom under vm.max_map_count"));
  }
  if (size > limits_.max_bytes_per_session - std::min(bytes, limits_.max_bytes_per_session)) {
    return Refuse("max_region_bytes_per_session",
                  absl::StrCat("size_bytes ", size, " would take session ", session,
                               "'s registered memory past its limit of ",
                               limits_.max_bytes_per_session, " bytes (", bytes, " in use)"));
  }
  if (size > limits_.max_total_bytes - std::min(total_bytes_, limits_.max_total_bytes)) {
    return Refuse("max_region_bytes",
                  absl::StrCat("size_bytes ", size,
                               " would take the daemon's registered memory past the limit of ",
                               limits_.max_total_bytes, " bytes (", total_bytes_, " in use)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RegionRegistry::Register(uint64_t session, std::string name,
                                                  std::unique_ptr<MappedRegion> mapping) {
  const uint64_t size = mapping->size();
  absl::MutexLock lock(&mu_);
  absl::Status admitted = CheckAdmissionLocked(session, size);
  if (!admitted.ok()) return admitted;  // `mapping` is unmapped on return
  // Counted while the mapping lives, wherever its last reference is.
  live_mappings_.fetch_add(1, std::memory_order_relaxed);
  std::atomic<uint64_t>* live = &live_mappings_;
  std::shared_ptr<MappedRegion> shared(mapping.release(), [live](MappedRegion* m) {
    delete m;
    live->fetch_sub(1, std::memory_order_relaxed);
  });
  const uint64_t id = next_id_++;
  SessionIndex& index = sessions_[session];
  index.ids.insert(id);
  index.bytes += size;
  total_bytes_ += size;
  entries_[id] = Entry{session, std::move(name), std::move(shared)};
  return id;
}

absl::Status RegionRegistry::Unregister(uint64_t session, uint64_t id) {
  std::shared_ptr<MappedRegion> doomed;  // unmapped outside the lock
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.session != session) {
    return absl::NotFoundError(absl::StrCat("region_id ", id, " is not registered by this session"));
  }
  if (it->second.pins > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region_id ", id, " is in use by ", it->second.pins, " call(s); unregister it after they end"));
  }
  const uint64_t size = it->second.mapping->size();
  total_bytes_ -= size;
  auto s = sessions_.find(session);
  s->second.ids.erase(id);
  s->second.bytes -= size;
  if (s->second.ids.empty()) sessions_.erase(s);
  doomed = std::move(it->second.mapping);
  entries_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<RegionPin> RegionRegistry::Pin(uint64_t session, uint64_t id,
                                              absl::string_view field) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.session != session) {
    return absl::NotFoundError(
        absl::StrCat(field, " ", id, " is not a region registered by this session"));
  }
  absl::Status intact = it->second.mapping->CheckIntact(absl::StrCat(field, " ", id));
  if (!intact.ok()) return intact;
  ++it->second.pins;
  return RegionPin(this, id, it->second.mapping);
}

void RegionRegistry::Unpin(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.pins > 0) --it->second.pins;
}

int RegionRegistry::DropSession(uint64_t session) {
  std::vector<std::shared_ptr<MappedRegion>> doomed;  // unmapped outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto s = sessions_.find(session);
    if (s == sessions_.end()) return 0;
    for (uint64_t id : s->second.ids) {
      auto it = entries_.find(id);
      total_bytes_ -= it->second.mapping->size();
      doomed.push_back(std::move(it->second.mapping));
      entries_.erase(it);
    }
    sessions_.erase(s);
  }
  return static_cast<int>(doomed.size());
}

std::vector<RegionSummary> RegionRegistry::List(uint64_t session) const {
  std::vector<RegionSummary> out;
  absl::MutexLock lock(&mu_);
  auto add = [&out](uint64_t id, const Entry& e) {
    out.push_back({id, e.session, e.name, e.mapping->kind(), e.mapping->size(), e.pins});
  };
  if (session == 0) {
    for (const auto& [id, e] : entries_) add(id, e);
  } else if (auto s = sessions_.find(session); s != sessions_.end()) {
    for (uint64_t id : s->second.ids) add(id, entries_.at(id));
  }
  std::sort(out.begin(), out.end(),
            [](const RegionSummary& a, const RegionSummary& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<RegionSummary> RegionRegistry::Get(uint64_t session, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.session != session) {
    return absl::NotFoundError(absl::StrCat("region_id ", id, " is not registered by this session"));
  }
  const Entry& e = it->second;
  return RegionSummary{id, e.session, e.name, e.mapping->kind(), e.mapping->size(), e.pins};
}

uint64_t RegionRegistry::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

uint64_t RegionRegistry::num_regions() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace hsap::shm

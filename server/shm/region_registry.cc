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

absl::StatusOr<uint64_t> RegionRegistry::Register(uint64_t session, std::string name,
                                                  std::unique_ptr<MappedRegion> mapping) {
  absl::MutexLock lock(&mu_);
  uint64_t& count = regions_per_session_[session];
  if (count >= limits_.max_regions_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat("session ", session, " already has ", count,
                                                     " regions, the limit"));
  }
  const uint64_t size = mapping->size();
  if (size > limits_.max_total_bytes - std::min(total_bytes_, limits_.max_total_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("size_bytes ", size, " would take registered memory past the limit of ",
                     limits_.max_total_bytes, " bytes (", total_bytes_, " in use)"));
  }
  const uint64_t id = next_id_++;
  ++count;
  total_bytes_ += size;
  entries_[id] = Entry{session, std::move(name), std::shared_ptr<MappedRegion>(std::move(mapping))};
  return id;
}

absl::Status RegionRegistry::Unregister(uint64_t session, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.session != session) {
    return absl::NotFoundError(absl::StrCat("region_id ", id, " is not registered by this session"));
  }
  if (it->second.pins > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region_id ", id, " is in use by ", it->second.pins, " call(s); unregister it after they end"));
  }
  total_bytes_ -= it->second.mapping->size();
  --regions_per_session_[session];
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
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.session == session) {
        total_bytes_ -= it->second.mapping->size();
        doomed.push_back(std::move(it->second.mapping));
        entries_.erase(it++);
      } else {
        ++it;
      }
    }
    regions_per_session_.erase(session);
  }
  return static_cast<int>(doomed.size());
}

std::vector<RegionSummary> RegionRegistry::List(uint64_t session) const {
  std::vector<RegionSummary> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (session != 0 && e.session != session) continue;
    out.push_back({id, e.session, e.name, e.mapping->kind(), e.mapping->size(), e.pins});
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

}  // namespace hsap::shm

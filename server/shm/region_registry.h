// The region registry: every region the daemon has mapped, owned by the
// session that registered it, reference-counted while calls use it.
//
// Lifetime rules (the ones Triton's shared-memory manager gets wrong):
//  * A region is visible only to its session: another session's id is
//    NOT_FOUND, exactly like an id that never existed.
//  * Pin() makes a RegionPin; while any pin is alive, Unregister() is
//    FAILED_PRECONDITION and the mapping cannot go away.
//  * DropSession() (the client disconnected) removes all of its regions at
//    once; a mapping that a running call still pins is unmapped when that
//    call releases its pin, never under it.
//
// Thread-safe.
#ifndef HSAP_SERVER_SHM_REGION_REGISTRY_H_
#define HSAP_SERVER_SHM_REGION_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/shm/region.h"

namespace hsap::shm {

class RegionRegistry;

// Keeps one region mapped and counted as in use. Move-only; releasing it
// (destruction) decrements the pin count. REQUIRES: the registry outlives it.
class RegionPin {
 public:
  RegionPin() = default;
  RegionPin(RegionPin&& other) noexcept { *this = std::move(other); }
  RegionPin& operator=(RegionPin&& other) noexcept;
  ~RegionPin() { Release(); }

  const MappedRegion* region() const { return mapping_.get(); }
  uint64_t id() const { return id_; }
  void Release();

 private:
  friend class RegionRegistry;
  RegionPin(RegionRegistry* registry, uint64_t id, std::shared_ptr<MappedRegion> mapping)
      : registry_(registry), id_(id), mapping_(std::move(mapping)) {}

  RegionRegistry* registry_ = nullptr;
  uint64_t id_ = 0;
  std::shared_ptr<MappedRegion> mapping_;
};

// A snapshot of one region for listings.
struct RegionSummary {
  uint64_t id = 0;
  uint64_t session = 0;
  std::string name;
  RegionKind kind = RegionKind::kMemfd;
  uint64_t size_bytes = 0;
  uint32_t pins = 0;
};

struct RegionLimits {
  uint64_t max_regions_per_session = 1024;
  uint64_t max_total_bytes = uint64_t{1} << 40;
};

class RegionRegistry {
 public:
  explicit RegionRegistry(RegionLimits limits = {}) : limits_(limits) {}
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Takes ownership of `mapping` for `session`; returns the new region id
  // (never 0). RESOURCE_EXHAUSTED past the limits, naming them.
  absl::StatusOr<uint64_t> Register(uint64_t session, std::string name,
                                    std::unique_ptr<MappedRegion> mapping);

  // NOT_FOUND unless `id` belongs to `session`; FAILED_PRECONDITION while pinned.
  absl::Status Unregister(uint64_t session, uint64_t id);

  // Pins region `id` of `session`. NOT_FOUND names `field` (e.g. "q.region_id").
  absl::StatusOr<RegionPin> Pin(uint64_t session, uint64_t id, absl::string_view field);

  // Removes every region of `session`; mappings still pinned live until unpinned.
  // Returns how many regions were removed.
  int DropSession(uint64_t session);

  // All regions (session == 0) or those of one session, sorted by id.
  std::vector<RegionSummary> List(uint64_t session = 0) const;
  absl::StatusOr<RegionSummary> Get(uint64_t session, uint64_t id) const;

  uint64_t total_bytes() const;

 private:
  friend class RegionPin;
  struct Entry {
    uint64_t session;
    std::string name;
    std::shared_ptr<MappedRegion> mapping;
    uint32_t pins = 0;
  };
  void Unpin(uint64_t id);

  const RegionLimits limits_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> regions_per_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_REGION_REGISTRY_H_

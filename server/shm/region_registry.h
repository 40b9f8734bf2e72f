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
//  * A region whose mapping faulted (the client shrank its object, see
//    region.h) stays registered but unusable: Pin() is FAILED_PRECONDITION
//    until the client unregisters it and registers the object again.
//
// Caps (RegionLimits; each RESOURCE_EXHAUSTED names its hsapd flag):
// regions per session and per daemon, registered bytes per session and per
// daemon, and live mappings (regions plus the unregistered ones a call
// still pins), which keeps headroom under vm.max_map_count.
//
// Cost: every operation on a session's regions touches only that session's
// index (Register/Unregister/Pin O(1), DropSession and List(session) O(its
// regions)); only the operator's List() walks every region.
//
// Thread-safe.
#ifndef HSAP_SERVER_SHM_REGION_REGISTRY_H_
#define HSAP_SERVER_SHM_REGION_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

  // OK unless a daemon access to the region faulted since it was mapped
  // (the client shrank it); then FAILED_PRECONDITION naming the region id,
  // its registered and current sizes. Call it after a call has run: a
  // faulted region's data read as zeros, so the call's results are void.
  absl::Status CheckIntact() const;

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

// The defaults are hsapd's flag defaults (server/main.cc).
struct RegionLimits {
  uint64_t max_regions_per_session = 1024;         // --max_regions_per_session
  uint64_t max_total_bytes = uint64_t{1} << 40;    // --max_region_bytes (1 TiB)
  uint64_t max_bytes_per_session = uint64_t{1} << 38;  // --max_region_bytes_per_session (256 GiB)
  uint64_t max_regions = 16384;                    // --max_regions
  // Live client mappings (--max_region_mappings); at most
  // SigbusGuard::kSlots.
  uint64_t max_mappings = 32768;
};

// Called with the limit's flag name each time a cap refuses a request
// (the daemon counts them in hsap_limit_refusals_total).
using LimitRefusalHook = std::function<void(const char* flag)>;

class RegionRegistry {
 public:
  explicit RegionRegistry(RegionLimits limits = {}, LimitRefusalHook on_refusal = nullptr)
      : limits_(limits), on_refusal_(std::move(on_refusal)) {}

  // Sets the refusal hook. REQUIRES: before the registry is shared.
  void SetRefusalHook(LimitRefusalHook on_refusal) { on_refusal_ = std::move(on_refusal); }
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Takes ownership of `mapping` for `session`; returns the new region id
  // (never 0). RESOURCE_EXHAUSTED past the limits, naming the flag.
  absl::StatusOr<uint64_t> Register(uint64_t session, std::string name,
                                    std::unique_ptr<MappedRegion> mapping);

  // What Register would say about a region of `size` bytes for `session`
  // now (RESOURCE_EXHAUSTED naming the flag, or OK), so that a refused
  // registration maps nothing. Register checks again.
  absl::Status CheckAdmission(uint64_t session, uint64_t size) const;

  // NOT_FOUND unless `id` belongs to `session`; FAILED_PRECONDITION while pinned.
  absl::Status Unregister(uint64_t session, uint64_t id);

  // Pins region `id` of `session`. NOT_FOUND names `field` (e.g.
  // "q.region_id"); FAILED_PRECONDITION for a region that faulted.
  absl::StatusOr<RegionPin> Pin(uint64_t session, uint64_t id, absl::string_view field);

  // Removes every region of `session`; mappings still pinned live until unpinned.
  // Returns how many regions were removed.
  int DropSession(uint64_t session);

  // All regions (session == 0) or those of one session, sorted by id.
  std::vector<RegionSummary> List(uint64_t session = 0) const;
  absl::StatusOr<RegionSummary> Get(uint64_t session, uint64_t id) const;

  uint64_t total_bytes() const;
  uint64_t num_regions() const;
  // Mappings alive now: registered regions plus unregistered ones still pinned.
  uint64_t live_mappings() const { return live_mappings_.load(std::memory_order_relaxed); }
  const RegionLimits& limits() const { return limits_; }

 private:
  friend class RegionPin;
  struct Entry {
    uint64_t session;
    std::string name;
    std::shared_ptr<MappedRegion> mapping;
    uint32_t pins = 0;
  };
  struct SessionIndex {
    absl::flat_hash_set<uint64_t> ids;
    uint64_t bytes = 0;
  };
  void Unpin(uint64_t id);
  absl::Status Refuse(const char* flag, std::string message) const;
  absl::Status CheckAdmissionLocked(uint64_t session, uint64_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegionLimits limits_;
  LimitRefusalHook on_refusal_;
  std::atomic<uint64_t> live_mappings_{0};
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, SessionIndex> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_REGION_REGISTRY_H_

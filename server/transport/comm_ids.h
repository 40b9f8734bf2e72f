// CommIdAllocator: the UCX communicator ids (the 10-bit `comm` field of
// ucx_tag.h) that one daemon's worker receives on, one per multi-node call
// in flight.
//
//   CommIdAllocator ids;                        // one per UcxWorker
//   HSAP_ASSIGN_OR_RETURN(CommIdAllocator::Lease lease, ids.Allocate());
//   ... post receives with comm = lease.id(); tell the senders (AgreePlan) ...
//   // the id is free again when `lease` is destroyed
//
// Receives are posted on the worker with a full mask, so they match a
// message from any endpoint whose tag is equal: an id only has to be unique
// among the calls alive on the receiving worker, and this allocator makes it
// so (no hash, no coordination with other nodes). Senders encode the
// receiving node's id, learnt from the plan agreement (docs/decisions.md,
// "Communicator ids").
//
// Reuse is first in, first out: a freed id goes to the back of the queue
// and is handed out again only after every other free id was, so a failed
// call's stray messages, which may still sit in UCX's unexpected queue under
// the old id, meet the longest possible run of other ids before it returns.
//
// Thread-safety: Allocate() and live() from any thread. A Lease may outlive
// its allocator (they share the id table).
#ifndef HSAP_SERVER_TRANSPORT_COMM_IDS_H_
#define HSAP_SERVER_TRANSPORT_COMM_IDS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace hsap::transport {

class CommIdAllocator {
  struct Table;

 public:
  // One live id, released on destruction. Move-only.
  class Lease {
   public:
    Lease() = default;  // holds no id
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { Release(); }

    bool held() const { return table_ != nullptr; }
    // REQUIRES: held().
    uint32_t id() const { return id_; }
    // Frees the id now (to the back of the reuse queue); no-op if not held.
    void Release();

   private:
    friend class CommIdAllocator;
    Lease(std::shared_ptr<Table> table, uint32_t id) : table_(std::move(table)), id_(id) {}
    std::shared_ptr<Table> table_;
    uint32_t id_ = 0;
  };

  // Ids [0, capacity). capacity is clamped to [1, 1024] (ucx_tag::kMaxComms);
  // tests use small ones.
  explicit CommIdAllocator(uint32_t capacity = 1024);

  // An id no other live lease of this allocator holds: the one freed
  // longest ago (ids never used come first, in increasing order).
  // RESOURCE_EXHAUSTED naming the limit when all `capacity` ids are live.
  absl::StatusOr<Lease> Allocate();

  // Ids held by live leases.
  uint32_t live() const;
  uint32_t capacity() const;

 private:
  std::shared_ptr<Table> table_;
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_COMM_IDS_H_

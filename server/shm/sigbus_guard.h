// SIGBUS-safe access to client memory.
//
// A client can shrink a shared object it registered (ftruncate of a POSIX
// shm object, which cannot be sealed): the daemon's next touch of a page
// past the new end raises SIGBUS, which by default kills the daemon. The
// same happens when a sparse object's file system is full. Wayland's
// wl_shm_buffer_begin_access answers this for compositors; HSAP does the
// same for the daemon:
//
//  * a SIGBUS handler, installed once (Install), looks the faulting
//    address up in a fixed-size, lock-free table of the live client
//    mappings (async-signal-safe: atomics only, no allocation, no lock);
//  * when the address lies in one, it maps anonymous zero pages over the
//    mapping from the faulting page to its end (MAP_FIXED, so the faulting
//    instruction resumes and reads zeros / writes into private memory) and
//    records the first faulting offset in that mapping's slot;
//  * otherwise it passes the signal on: to the handler installed before it
//    (ASan's, UCX's), or to the default action (the process dies with
//    SIGBUS, as it would have without the guard).
// After a call, the caller asks the mapping whether it faulted
// (Registration::faulted) and ends the call with a clear status instead;
// the mapping is then unusable (its tail is zeros, not the client's data).
//
// Unregistering waits until no handler is inside the mapping's slot, so
// the handler never maps over an address range that was unmapped and
// reused meanwhile.
//
// Thread-safety: everything is thread-safe; the handler runs on the
// faulting thread.
#ifndef HSAP_SERVER_SHM_SIGBUS_GUARD_H_
#define HSAP_SERVER_SHM_SIGBUS_GUARD_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace hsap::shm {

class SigbusGuard {
 public:
  // Slots of the table: at most this many client mappings live at once
  // (the registry's mapping cap must not exceed it).
  static constexpr int kSlots = 1 << 16;
  static constexpr uint64_t kNoFault = ~uint64_t{0};

  // One live mapping in the table; removes it on destruction.
  class Registration {
   public:
    ~Registration();
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;

    // True once an access inside the mapping raised SIGBUS.
    bool faulted() const { return first_fault_offset() != kNoFault; }
    // Byte offset (from the mapping's start) of the first page that
    // faulted, or kNoFault.
    uint64_t first_fault_offset() const;

   private:
    friend class SigbusGuard;
    explicit Registration(int slot) : slot_(slot) {}
    const int slot_;
  };

  // Installs the handler (idempotent, thread-safe). Register() calls it.
  static void Install();

  // Adds [begin, begin + size) to the table. RESOURCE_EXHAUSTED when all
  // kSlots are taken. REQUIRES: the range is mapped until the Registration
  // is destroyed.
  static absl::StatusOr<std::unique_ptr<Registration>> Register(void* begin, uint64_t size);

  // Mappings registered now.
  static int live();
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_SIGBUS_GUARD_H_

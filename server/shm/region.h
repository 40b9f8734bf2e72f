// A region: memory a client shares with the daemon, mapped once at
// registration and unmapped when the last user lets go (RAII).
//
// Sources and the rules they must follow (docs/reliability.md, "Regions"):
//  * a memfd passed over the session socket. It must be sealable: the
//    daemon adds F_SEAL_SHRINK (when the memfd does not carry it already)
//    before it checks the size, so the client can never shrink it under a
//    call. A memfd created without MFD_ALLOW_SEALING (it carries
//    F_SEAL_SEAL) and not sealed against shrinking is FAILED_PRECONDITION,
//    saying how to create it; so is one sealed against writing (the daemon
//    writes outputs into regions).
//  * a POSIX shm object by name (a tmpfs file under /dev/shm). Those
//    cannot be sealed; every daemon access to them is SIGBUS-safe
//    (sigbus_guard.h): if the client shrinks one, the call that touched
//    the missing pages ends FAILED_PRECONDITION (CheckIntact) and the
//    daemon keeps serving.
//  * nothing else: a regular file on a disk file system, a read-only or
//    write-only descriptor, an O_PATH descriptor, a pipe, a socket, a
//    device, a directory are INVALID_ARGUMENT naming what the fd is.
// Every mapping is in the SIGBUS guard's table, sealed or not.
// Every access goes through CheckRange, which is overflow-safe, so a bad
// TensorRef is an INVALID_ARGUMENT, never a fault.
#ifndef HSAP_SERVER_SHM_REGION_H_
#define HSAP_SERVER_SHM_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/unique_fd.h"
#include "server/shm/sigbus_guard.h"

namespace hsap::shm {

enum class RegionKind { kMemfd, kShm };

// A read/write shared mapping of `size` bytes. Move-only; unmaps on
// destruction. Thread-compatible: the bytes themselves are shared with the
// client, and the daemon only touches them while a call pins the region.
class MappedRegion {
 public:
  // Maps `size` bytes of the memfd `fd` from offset 0 after sealing it
  // against shrinking (see the file comment). The fd is not kept open.
  // INVALID_ARGUMENT when size is 0, larger than the object, or the fd is
  // not a memfd / shm object; FAILED_PRECONDITION when it cannot be
  // sealed; mmap failures become RESOURCE_EXHAUSTED (ENOMEM: the mapping
  // limit) or INTERNAL with errno text.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> FromFd(int fd, uint64_t size,
                                                              RegionKind kind);

  // Opens and maps a POSIX shm object by name (ValidateShmName first).
  // NOT_FOUND when it does not exist. Unsealable: kept SIGBUS-guarded, and
  // its fd stays open so that CheckIntact can report its current size.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> FromShmName(absl::string_view name,
                                                                   uint64_t size);

  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  RegionKind kind() const { return kind_; }
  // True when the object is sealed against shrinking (every memfd region).
  bool sealed() const { return sealed_; }

  // OK iff [offset, offset + bytes) lies inside the mapping, computed
  // without overflow. The error names `field` and the values.
  absl::Status CheckRange(uint64_t offset, uint64_t bytes, absl::string_view field) const;

  // True once a daemon access to the mapping raised SIGBUS (the object
  // shrank, or its file system ran out of space). Such a mapping is
  // unusable: its tail reads zeros.
  bool faulted() const { return guard_->faulted(); }
  // OK unless faulted(); then FAILED_PRECONDITION naming `what` (e.g.
  // "region 7"), the registered size, the faulting offset and the object's
  // current size where the daemon can still see it.
  absl::Status CheckIntact(absl::string_view what) const;

 private:
  MappedRegion(uint8_t* data, uint64_t size, RegionKind kind, bool sealed,
               std::unique_ptr<SigbusGuard::Registration> guard, UniqueFd fd)
      : data_(data), size_(size), kind_(kind), sealed_(sealed), guard_(std::move(guard)),
        fd_(std::move(fd)) {}
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Map(int fd, uint64_t size, RegionKind kind,
                                                           bool sealed, UniqueFd keep);

  uint8_t* data_;
  uint64_t size_;
  RegionKind kind_;
  bool sealed_;
  std::unique_ptr<SigbusGuard::Registration> guard_;
  UniqueFd fd_;  // kept for unsealed objects only (CheckIntact's current size)
};

// "/name": one leading slash, then 1..200 of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateShmName(absl::string_view name);

// What `fd` is, in words ("a pipe", "a regular file on a disk file system
// (ext2/3/4)", "an O_PATH descriptor", ...), when it cannot be a region;
// OK for a read-write memfd or tmpfs/hugetlbfs file.
absl::Status CheckRegionFd(int fd);

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_REGION_H_

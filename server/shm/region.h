// A region: memory a client shares with the daemon, mapped once at
// registration and unmapped when the last user lets go (RAII).
//
// Sources: a memfd passed over the session socket, or a POSIX shm name.
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

namespace hsap::shm {

enum class RegionKind { kMemfd, kShm };

// A read/write shared mapping of `size` bytes. Move-only; unmaps on
// destruction. Thread-compatible: the bytes themselves are shared with the
// client, and the daemon only touches them while a call pins the region.
class MappedRegion {
 public:
  // Maps `size` bytes of `fd` from offset 0 (the fd is not kept open).
  // INVALID_ARGUMENT when size is 0 or larger than the object; fstat/mmap
  // failures become INTERNAL with errno text.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> FromFd(int fd, uint64_t size,
                                                              RegionKind kind);

  // Opens and maps a POSIX shm object by name (ValidateShmName first).
  // NOT_FOUND when it does not exist.
  static absl::StatusOr<std::unique_ptr<MappedRegion>> FromShmName(absl::string_view name,
                                                                   uint64_t size);

  ~MappedRegion();
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  RegionKind kind() const { return kind_; }

  // OK iff [offset, offset + bytes) lies inside the mapping, computed
  // without overflow. The error names `field` and the values.
  absl::Status CheckRange(uint64_t offset, uint64_t bytes, absl::string_view field) const;

 private:
  MappedRegion(uint8_t* data, uint64_t size, RegionKind kind)
      : data_(data), size_(size), kind_(kind) {}

  uint8_t* data_;
  uint64_t size_;
  RegionKind kind_;
};

// "/name": one leading slash, then 1..200 of [A-Za-z0-9._-], not "." or "..".
absl::Status ValidateShmName(absl::string_view name);

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_REGION_H_

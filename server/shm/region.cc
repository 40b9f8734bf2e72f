#include "server/shm/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hsap::shm {

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::FromFd(int fd, uint64_t size,
                                                                   RegionKind kind) {
  if (size == 0) return absl::InvalidArgumentError("size_bytes is 0: a region needs at least 1 byte");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of the region fd failed: ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the region fd is not a memfd or shared-memory object");
  }
  if (st.st_size < 0 || size > static_cast<uint64_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes is ", size,
                                                   " but the shared object holds only ",
                                                   static_cast<int64_t>(st.st_size), " bytes"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of ", size, " bytes failed: ", strerror(errno)));
  }
  return std::unique_ptr<MappedRegion>(new MappedRegion(static_cast<uint8_t*>(p), size, kind));
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::FromShmName(absl::string_view name,
                                                                        uint64_t size) {
  absl::Status valid = ValidateShmName(name);
  if (!valid.ok()) return valid;
  const std::string n(name);
  const int fd = shm_open(n.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("shm.name '", n, "' does not exist"));
    return absl::PermissionDeniedError(
        absl::StrCat("shm_open('", n, "') failed: ", strerror(errno)));
  }
  auto region = FromFd(fd, size, RegionKind::kShm);
  close(fd);
  return region;
}

MappedRegion::~MappedRegion() {
  if (data_ != nullptr) munmap(data_, size_);
}

absl::Status MappedRegion::CheckRange(uint64_t offset, uint64_t bytes,
                                      absl::string_view field) const {
  // offset + bytes <= size, written so nothing can wrap.
  if (offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " spans bytes [", offset, ", ", offset, " + ", bytes,
        ") which is past the end of its region of ", size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShmName(absl::string_view name) {
  if (name.size() < 2 || name.size() > 201 || name[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm.name '", name.substr(0, 64), "' must be '/' followed by 1 to 200 characters"));
  }
  const absl::string_view rest = name.substr(1);
  if (rest == "." || rest == "..") {
    return absl::InvalidArgumentError(absl::StrCat("shm.name '", name, "' is not allowed"));
  }
  for (char c : rest) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm.name '", name.substr(0, 64), "' has character 0x",
          absl::Hex(static_cast<unsigned char>(c)), ": only [A-Za-z0-9._-] after the slash"));
    }
  }
  return absl::OkStatus();
}

}  // namespace hsap::shm

#include "server/shm/region.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace hsap::shm {
namespace {

std::string FsName(unsigned long type) {
  switch (type) {
    case EXT4_SUPER_MAGIC: return "ext2/3/4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
    case NFS_SUPER_MAGIC: return "nfs";
    case PROC_SUPER_MAGIC: return "proc";
    case SYSFS_MAGIC: return "sysfs";
    default: return absl::StrCat("file system type 0x", absl::Hex(type));
  }
}

std::string ModeKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a pipe (FIFO)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return absl::StrCat("a file of type 0x", absl::Hex(mode & S_IFMT));
}

// True for a memfd: /proc/self/fd/N reads "/memfd:<name> (deleted)".
bool IsMemfd(int fd) {
  char target[64] = {};
  const ssize_t n = readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), target, sizeof(target) - 1);
  return n > 0 && absl::StartsWith(target, "/memfd:");
}

// Adds F_SEAL_SHRINK where possible. OK and *sealed = true when the object
// can no longer shrink; OK and *sealed = false for an unsealable POSIX shm
// object (kShm); FAILED_PRECONDITION for an unsealable fd source.
absl::Status SealAgainstShrinking(int fd, RegionKind kind, bool* sealed) {
  *sealed = false;
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) seals = F_SEAL_SEAL;  // EINVAL: the file system has no seals
  if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
    return absl::FailedPreconditionError(
        "the region's object is sealed against writing (F_SEAL_WRITE or F_SEAL_FUTURE_WRITE); "
        "the daemon writes outputs into regions: register an object it may write");
  }
  if ((seals & F_SEAL_SHRINK) == 0 && (seals & F_SEAL_SEAL) == 0) {
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      return absl::InternalError(
          absl::StrCat("fcntl(F_ADD_SEALS, F_SEAL_SHRINK) on the region fd failed: ", strerror(errno)));
    }
    seals |= F_SEAL_SHRINK;
  }
  if (seals & F_SEAL_SHRINK) {
    *sealed = true;
    return absl::OkStatus();
  }
  if (kind == RegionKind::kShm) return absl::OkStatus();  // guarded instead
  if (IsMemfd(fd)) {
    return absl::FailedPreconditionError(
        "the memfd cannot be sealed against shrinking: it was created without MFD_ALLOW_SEALING "
        "(or sealed with F_SEAL_SEAL first). Create it with memfd_create(name, MFD_CLOEXEC | "
        "MFD_ALLOW_SEALING) and do not add F_SEAL_SEAL; the daemon adds F_SEAL_SHRINK itself");
  }
  return absl::FailedPreconditionError(
      "the fd is a tmpfs file that cannot be sealed against shrinking: pass a memfd created "
      "with MFD_ALLOW_SEALING, or register a POSIX shm object by name (the shm source)");
}

}  // namespace

absl::Status CheckRegionFd(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the region fd is not an open descriptor: ",
                                                   strerror(errno)));
  }
  if (flags & O_PATH) {
    return absl::InvalidArgumentError(
        "the region fd is an O_PATH descriptor, which cannot be mapped; pass a memfd");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fstat of the region fd failed: ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region fd is ", ModeKind(st.st_mode), ", not a memfd or shared-memory object"));
  }
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fstatfs of the region fd failed: ", strerror(errno)));
  }
  if (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region fd is a regular file on a disk file system (", FsName(fs.f_type),
        "), not a memfd or shared-memory object"));
  }
  if ((flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region fd is opened ", (flags & O_ACCMODE) == O_RDONLY ? "read-only" : "write-only",
        "; the daemon reads inputs and writes outputs: pass it opened O_RDWR"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::FromFd(int fd, uint64_t size,
                                                                   RegionKind kind) {
  if (size == 0) return absl::InvalidArgumentError("size_bytes is 0: a region needs at least 1 byte");
  HSAP_RETURN_IF_ERROR(CheckRegionFd(fd));
  bool sealed = false;
  // Seal first, then check the size: the object cannot shrink in between.
  HSAP_RETURN_IF_ERROR(SealAgainstShrinking(fd, kind, &sealed));
  UniqueFd keep;
  if (!sealed) {
    keep.reset(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!keep.valid()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon cannot keep the unsealed region's fd: ", strerror(errno)));
    }
  }
  return Map(fd, size, kind, sealed, std::move(keep));
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Map(int fd, uint64_t size,
                                                                RegionKind kind, bool sealed,
                                                                UniqueFd keep) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of the region fd failed: ", strerror(errno)));
  }
  if (st.st_size < 0 || size > static_cast<uint64_t>(st.st_size)) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes is ", size,
                                                   " but the shared object holds only ",
                                                   static_cast<int64_t>(st.st_size), " bytes"));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (errno == ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "mmap of ", size, " bytes failed: ", strerror(errno),
          " (the daemon's address space or vm.max_map_count is exhausted)"));
    }
    return absl::InternalError(absl::StrCat("mmap of ", size, " bytes failed: ", strerror(errno)));
  }
  auto guard = SigbusGuard::Register(p, size);
  if (!guard.ok()) {
    munmap(p, size);
    return guard.status();
  }
  return std::unique_ptr<MappedRegion>(new MappedRegion(
      static_cast<uint8_t*>(p), size, kind, sealed, std::move(guard).value(), std::move(keep)));
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::FromShmName(absl::string_view name,
                                                                        uint64_t size) {
  HSAP_RETURN_IF_ERROR(ValidateShmName(name));
  const std::string n(name);
  // O_NONBLOCK: a FIFO planted under /dev/shm must not block the daemon
  // (it is then refused as "a pipe").
  UniqueFd fd(shm_open(n.c_str(), O_RDWR | O_NONBLOCK, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("shm.name '", n, "' does not exist"));
    return absl::PermissionDeniedError(
        absl::StrCat("shm_open('", n, "') failed: ", strerror(errno)));
  }
  return FromFd(fd.get(), size, RegionKind::kShm);
}

MappedRegion::~MappedRegion() {
  guard_.reset();  // out of the SIGBUS table before the range is unmapped
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

absl::Status MappedRegion::CheckIntact(absl::string_view what) const {
  if (!faulted()) return absl::OkStatus();
  std::string now = "its current size is unknown";
  struct stat st;
  if (fd_.valid() && fstat(fd_.get(), &st) == 0) {
    now = absl::StrCat("it now holds ", static_cast<int64_t>(st.st_size), " bytes");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what, " shrank while the daemon used it: registered with ", size_, " bytes, ", now,
      "; the daemon's access at byte offset ", guard_->first_fault_offset(),
      " faulted (SIGBUS), so the call's results are void. The region stays unusable: "
      "unregister it and register the object again (and do not shrink registered objects)"));
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

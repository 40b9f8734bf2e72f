// Regions that cannot hurt the daemon: which fds are accepted, the seal
// against shrinking, and the SIGBUS guard for objects that cannot be sealed.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/vfs.h>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shm/region.h"
#include "server/shm/region_registry.h"
#include "server/shm/sigbus_guard.h"

namespace hsap::shm {
namespace {

using ::testing::HasSubstr;

UniqueFd Memfd(unsigned flags, off_t size) {
  UniqueFd fd(memfd_create("hsap-safety", flags));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(ftruncate(fd.get(), size), 0);
  return fd;
}

// A fresh POSIX shm object of `size` bytes; unlinked by the destructor.
struct ShmObject {
  explicit ShmObject(off_t size) {
    name = "/hsap-safety-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
    fd = UniqueFd(shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(ftruncate(fd.get(), size), 0);
  }
  ~ShmObject() { shm_unlink(name.c_str()); }
  std::string name;
  UniqueFd fd;
  static inline int counter = 0;
};

TEST(RegionSafetyTest, MemfdIsSealedAgainstShrinking) {
  UniqueFd fd = Memfd(MFD_CLOEXEC | MFD_ALLOW_SEALING, 8192);
  auto r = MappedRegion::FromFd(fd.get(), 8192, RegionKind::kMemfd);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->sealed());
  EXPECT_NE(fcntl(fd.get(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  // The client can no longer shrink it (it may still grow it).
  EXPECT_NE(ftruncate(fd.get(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(fd.get(), 16384), 0);
  (*r)->data()[8191] = 1;
  EXPECT_TRUE((*r)->CheckIntact("region 1").ok());
}

TEST(RegionSafetyTest, UnsealableMemfdIsFailedPreconditionSayingHow) {
  UniqueFd fd = Memfd(MFD_CLOEXEC, 4096);  // carries F_SEAL_SEAL
  auto r = MappedRegion::FromFd(fd.get(), 4096, RegionKind::kMemfd);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("MFD_ALLOW_SEALING"));
  // Already sealed against shrinking (and then F_SEAL_SEAL): accepted.
  UniqueFd sealed = Memfd(MFD_CLOEXEC | MFD_ALLOW_SEALING, 4096);
  ASSERT_EQ(fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  EXPECT_TRUE(MappedRegion::FromFd(sealed.get(), 4096, RegionKind::kMemfd).ok());
  // Sealed against writing: the daemon could not write outputs.
  UniqueFd ro = Memfd(MFD_CLOEXEC | MFD_ALLOW_SEALING, 4096);
  ASSERT_EQ(fcntl(ro.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  auto w = MappedRegion::FromFd(ro.get(), 4096, RegionKind::kMemfd);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("sealed against writing"));
  // A POSIX shm object's fd passed as a memfd cannot be sealed either.
  ShmObject shm(4096);
  auto s = MappedRegion::FromFd(shm.fd.get(), 4096, RegionKind::kMemfd);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("register a POSIX shm object by name"));
}

TEST(RegionSafetyTest, OtherFdKindsAreInvalidArgumentNamingTheKind) {
  auto expect = [](int fd, const std::string& text) {
    auto r = MappedRegion::FromFd(fd, 64, RegionKind::kMemfd);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(text));
  };
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  UniqueFd p0(p[0]), p1(p[1]);
  expect(p0.get(), "a pipe (FIFO)");
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd s0(sv[0]), s1(sv[1]);
  expect(s0.get(), "a socket");
  UniqueFd dir(open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  expect(dir.get(), "a directory");
  UniqueFd dev(open("/dev/null", O_RDWR | O_CLOEXEC));
  expect(dev.get(), "a character device");
  // A regular file on a disk file system (the test's working directory is
  // not tmpfs under Bazel; skip the check where it is).
  const std::string path = "hsap-safety-disk-file";
  UniqueFd disk(open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600));
  ASSERT_TRUE(disk.valid());
  ASSERT_EQ(ftruncate(disk.get(), 4096), 0);
  unlink(path.c_str());
  struct statfs fs;
  ASSERT_EQ(fstatfs(disk.get(), &fs), 0);
  if (fs.f_type != 0x01021994) expect(disk.get(), "a regular file on a disk file system");
  // tmpfs files opened read-only, write-only, or as O_PATH.
  ShmObject shm(4096);
  const std::string dev_shm = "/dev/shm" + shm.name;
  UniqueFd ro(open(dev_shm.c_str(), O_RDONLY | O_CLOEXEC));
  expect(ro.get(), "opened read-only");
  UniqueFd wo(open(dev_shm.c_str(), O_WRONLY | O_CLOEXEC));
  expect(wo.get(), "opened write-only");
  UniqueFd path_fd(open(dev_shm.c_str(), O_PATH | O_CLOEXEC));
  expect(path_fd.get(), "an O_PATH descriptor");
  expect(987654, "not an open descriptor");
}

TEST(RegionSafetyTest, TruncatedShmObjectFaultsSafelyAndIsReported) {
  ShmObject shm(3 * 4096);
  auto r = MappedRegion::FromShmName(shm.name, 3 * 4096);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)->sealed());
  volatile uint8_t* data = (*r)->data();
  data[0] = 5;
  data[2 * 4096] = 6;
  ASSERT_EQ(ftruncate(shm.fd.get(), 4096), 0);  // the client shrinks it
  // Past the new end: without the guard this access is a SIGBUS.
  EXPECT_EQ(data[2 * 4096 + 10], 0);
  data[2 * 4096 + 11] = 9;  // writes land in private zero pages
  EXPECT_EQ(data[0], 5);    // the part still inside the object is intact
  EXPECT_TRUE((*r)->faulted());
  const absl::Status st = (*r)->CheckIntact("region 12");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("region 12 shrank while the daemon used it"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("registered with 12288 bytes, it now holds 4096"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("at byte offset 8192"));
}

TEST(RegionSafetyTest, RegistryRefusesToPinAFaultedRegionUntilReregistered) {
  ShmObject shm(2 * 4096);
  RegionRegistry registry;
  auto mapping = MappedRegion::FromShmName(shm.name, 2 * 4096);
  ASSERT_TRUE(mapping.ok());
  auto id = registry.Register(1, "shrinks", std::move(mapping).value());
  ASSERT_TRUE(id.ok());
  {
    auto pin = registry.Pin(1, *id, "q.region_id");
    ASSERT_TRUE(pin.ok());
    ASSERT_EQ(ftruncate(shm.fd.get(), 0), 0);
    EXPECT_EQ(static_cast<volatile const uint8_t*>(pin->region()->data())[4096], 0);
    const absl::Status st = pin->CheckIntact();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat("region ", *id, " shrank")));
  }
  auto again = registry.Pin(1, *id, "k.region_id");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("unregister it and register"));
  EXPECT_TRUE(registry.Unregister(1, *id).ok());
  ASSERT_EQ(ftruncate(shm.fd.get(), 2 * 4096), 0);
  auto fresh = MappedRegion::FromShmName(shm.name, 2 * 4096);
  ASSERT_TRUE(fresh.ok());
  auto id2 = registry.Register(1, "again", std::move(fresh).value());
  ASSERT_TRUE(id2.ok());
  auto pin = registry.Pin(1, *id2, "q.region_id");
  ASSERT_TRUE(pin.ok());
  EXPECT_TRUE(pin->CheckIntact().ok());
}

// A SIGBUS outside client memory still kills the process (the guard passes
// it on): the daemon does not swallow its own bugs.
TEST(RegionSafetyDeathTest, SigbusElsewhereIsNotSwallowed) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  SigbusGuard::Install();
  EXPECT_EXIT(
      {
        const char* name = "/hsap-safety-death";
        shm_unlink(name);
        const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
        if (ftruncate(fd, 4096) != 0) std::exit(2);
        void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        shm_unlink(name);
        // Not registered with the guard: page 2 is past the end.
        static_cast<volatile char*>(p)[4096] = 1;
        std::exit(0);
      },
      // Killed by SIGBUS; under ASan its own SIGBUS report (abort_on_error)
      // ends it instead. Either way it does not go on.
      [](int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }, "");
}

}  // namespace
}  // namespace hsap::shm

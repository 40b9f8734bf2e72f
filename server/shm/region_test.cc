#include "server/shm/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace hsap::shm {
namespace {

std::unique_ptr<MappedRegion> MakeMemfd(uint64_t size) {
  const int fd = memfd_create("hsap-region-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, size), 0);
  auto r = MappedRegion::FromFd(fd, size, RegionKind::kMemfd);
  close(fd);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

TEST(RegionTest, CheckRangeIsOverflowSafe) {
  auto r = MakeMemfd(4096);
  EXPECT_TRUE(r->CheckRange(0, 4096, "q").ok());
  EXPECT_TRUE(r->CheckRange(4096, 0, "q").ok());
  auto st = r->CheckRange(4000, 100, "k");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("k spans bytes [4000, 4000 + 100)"), std::string::npos) << st;
  EXPECT_NE(st.message().find("4096 bytes"), std::string::npos) << st;
  const uint64_t huge = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(r->CheckRange(huge - 10, 100, "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r->CheckRange(16, huge, "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r->CheckRange(huge, 0, "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegionTest, SizeMustFitTheObject) {
  const int fd = memfd_create("hsap-region-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  auto r = MappedRegion::FromFd(fd, 200, RegionKind::kMemfd);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("size_bytes is 200"), std::string::npos) << r.status();
  EXPECT_EQ(MappedRegion::FromFd(fd, 0, RegionKind::kMemfd).status().code(),
            absl::StatusCode::kInvalidArgument);
  close(fd);
}

TEST(RegionTest, ShmNames) {
  EXPECT_TRUE(ValidateShmName("/hsap-trainer_0.q").ok());
  EXPECT_FALSE(ValidateShmName("hsap").ok());
  EXPECT_FALSE(ValidateShmName("/").ok());
  EXPECT_FALSE(ValidateShmName("/a/b").ok());
  EXPECT_FALSE(ValidateShmName("/..").ok());
  EXPECT_FALSE(ValidateShmName(std::string("/a\0b", 4)).ok());
  EXPECT_FALSE(ValidateShmName("/" + std::string(201, 'x')).ok());
  auto missing = MappedRegion::FromShmName("/hsap-does-not-exist-12345", 10);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(RegionTest, ShmRoundTrip) {
  const char* name = "/hsap-region-test-shm";
  shm_unlink(name);
  const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  close(fd);
  auto r = MappedRegion::FromShmName(name, 64);
  ASSERT_TRUE(r.ok()) << r.status();
  (*r)->data()[63] = 7;
  EXPECT_EQ((*r)->kind(), RegionKind::kShm);
  shm_unlink(name);
}

}  // namespace
}  // namespace hsap::shm

#include "server/shm/region_registry.h"

#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace hsap::shm {
namespace {

std::unique_ptr<MappedRegion> MakeMemfd(const char* name, uint64_t size) {
  const int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_EQ(ftruncate(fd, size), 0);
  auto r = MappedRegion::FromFd(fd, size, RegionKind::kMemfd);
  close(fd);
  return std::move(r).value();
}

bool IsMapped(const std::string& memfd_name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream ss;
  ss << maps.rdbuf();
  return ss.str().find("memfd:" + memfd_name) != std::string::npos;
}

TEST(RegionRegistryTest, SessionsSeeOnlyTheirRegions) {
  RegionRegistry reg;
  auto id = reg.Register(1, "a", MakeMemfd("hsap-reg-a", 4096));
  ASSERT_TRUE(id.ok());
  auto other = reg.Pin(2, *id, "q.region_id");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(other.status().message().find("q.region_id"), std::string::npos);
  EXPECT_EQ(reg.Unregister(2, *id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.List(2).size(), 0u);
  EXPECT_EQ(reg.List(1).size(), 1u);
  EXPECT_EQ(reg.total_bytes(), 4096u);
  EXPECT_TRUE(reg.Unregister(1, *id).ok());
  EXPECT_EQ(reg.total_bytes(), 0u);
  EXPECT_EQ(reg.Unregister(1, *id).code(), absl::StatusCode::kNotFound);
}

TEST(RegionRegistryTest, UnregisterWhilePinnedIsFailedPrecondition) {
  RegionRegistry reg;
  auto id = reg.Register(1, "a", MakeMemfd("hsap-reg-b", 4096));
  ASSERT_TRUE(id.ok());
  {
    auto pin = reg.Pin(1, *id, "k.region_id");
    ASSERT_TRUE(pin.ok());
    auto st = reg.Unregister(1, *id);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("region_id"), std::string::npos) << st;
    EXPECT_EQ(reg.Get(1, *id)->pins, 1u);
    RegionPin moved = std::move(pin).value();  // moving keeps one pin
    EXPECT_EQ(reg.Get(1, *id)->pins, 1u);
  }
  EXPECT_EQ(reg.Get(1, *id)->pins, 0u);
  EXPECT_TRUE(reg.Unregister(1, *id).ok());
}

TEST(RegionRegistryTest, DropSessionUnmapsOnlyAfterTheLastPin) {
  RegionRegistry reg;
  auto a = reg.Register(7, "a", MakeMemfd("hsap-reg-drop-a", 8192));
  auto b = reg.Register(7, "b", MakeMemfd("hsap-reg-drop-b", 8192));
  ASSERT_TRUE(a.ok() && b.ok());
  auto pin = reg.Pin(7, *a, "q.region_id");
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(reg.DropSession(7), 2);
  EXPECT_EQ(reg.total_bytes(), 0u);
  EXPECT_FALSE(IsMapped("hsap-reg-drop-b"));
  EXPECT_TRUE(IsMapped("hsap-reg-drop-a"));  // a call still uses it
  pin->region()->data()[8191] = 1;           // and may still write it
  pin->Release();
  EXPECT_FALSE(IsMapped("hsap-reg-drop-a"));
}

TEST(RegionRegistryTest, LimitsAreEnforced) {
  RegionRegistry reg(RegionLimits{2, 10000});
  EXPECT_TRUE(reg.Register(1, "a", MakeMemfd("hsap-lim", 4096)).ok());
  auto big = reg.Register(1, "b", MakeMemfd("hsap-lim", 8192));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(reg.Register(1, "c", MakeMemfd("hsap-lim", 4096)).ok());
  EXPECT_EQ(reg.Register(1, "d", MakeMemfd("hsap-lim", 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace hsap::shm

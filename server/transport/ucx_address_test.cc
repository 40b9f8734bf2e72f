#include "server/transport/ucx_address.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/ucx_worker.h"

namespace hsap::transport {
namespace {

using ::testing::HasSubstr;

class UcxAddressTest : public ::testing::TestWithParam<std::string> {};

// A real UCX 1.13 worker address of every transport set parses, validates
// against itself and against another worker with the same transports, and
// connects.
TEST_P(UcxAddressTest, RealAddressesAreAccepted) {
  auto a = UcxWorker::Create({.transports = GetParam()});
  auto b = UcxWorker::Create({.transports = GetParam()});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto layout = ParseOwnUcxAddress((*a)->Address());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_GE(layout->num_devices, 1);
  EXPECT_GE(layout->interfaces.size(), 1u);
  std::printf("UCX_TLS=%s: %zu-byte address, format v%d, %d devices, %zu interfaces, %zu attribute bytes\n",
              GetParam().c_str(), (*a)->Address().size(), layout->version + 1,
              layout->num_devices, layout->interfaces.size(), layout->attribute_bytes);
  EXPECT_TRUE((*b)->ValidatePeerAddress((*a)->Address()).ok());
  EXPECT_TRUE((*b)->Connect(0, (*a)->Address()).ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxAddressTest,
                         ::testing::Values("tcp", "posix,sysv,cma,self", "shm,tcp", ""));

class UcxGarbageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto w = UcxWorker::Create({.transports = "tcp,posix,sysv,cma,self"});
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(w).value();
    own_ = worker_->Address();
  }
  // Refused with INVALID_ARGUMENT by the validator and by Connect.
  void ExpectRefused(const std::string& bytes, const std::string& text) {
    const absl::Status st = worker_->ValidatePeerAddress(bytes);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(text));
    EXPECT_EQ(worker_->Connect(1, bytes).code(), absl::StatusCode::kInvalidArgument);
  }
  std::unique_ptr<UcxWorker> worker_;
  std::string own_;
};

TEST_F(UcxGarbageTest, TheInputsThatAbortedTheDaemonAreRefused) {
  ExpectRefused(std::string(8, '\xff'), "format version 15");
  std::mt19937 rng(1);
  std::string big(64 << 10, '\0');
  for (char& c : big) c = static_cast<char>(rng());
  ExpectRefused(big, "65536 bytes");
  ExpectRefused("", "0 bytes");
  ExpectRefused("abc", "3 bytes");
}

TEST_F(UcxGarbageTest, TruncatedAndExtendedAddressesAreRefused) {
  for (size_t n = kMinUcxAddressBytes; n < own_.size(); ++n) {
    const absl::Status st = worker_->ValidatePeerAddress(own_.substr(0, n));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << n << " bytes";
  }
  ExpectRefused(own_ + "x", "byte(s) follow");
}

TEST_F(UcxGarbageTest, RandomBytesAreRefused) {
  std::mt19937 rng(2);
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s(8 + rng() % 600, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    if (i % 2 == 0) s[0] = own_[0];  // a plausible header half the time
    refused += !worker_->ValidatePeerAddress(s).ok();
  }
  EXPECT_EQ(refused, 20000);
}

// Out-of-range packed attributes made UCX's lane selection abort
// (select.c "Assertion `(score >= 0.0) ...'" with a NaN or negative
// bandwidth, found by feeding mutated addresses to ucp_ep_create).
TEST_F(UcxGarbageTest, AttributesThatBreakUcxScoringAreRefused) {
  auto layout = ParseOwnUcxAddress(own_);
  ASSERT_TRUE(layout.ok());
  if (layout->version != 0) GTEST_SKIP() << "v2 packs attributes as fp8";
  // The first interface's attributes: header(1) + uuid(8) + md(1) + device
  // length(1) + device address + checksum(2).
  ASSERT_EQ(layout->header_flags, 0x2) << "the test assumes UCX's default header";
  const size_t attributes = 1 + 8 + 1 + 1 + layout->interfaces[0].device_address_bytes + 2;
  for (float bad : {std::nanf(""), -1.0f, INFINITY, 0.0f}) {
    std::string s = own_;
    std::memcpy(&s[attributes + 4], &bad, 4);  // the bandwidth
    ExpectRefused(s, "interface attributes out of range");
  }
}

// Every single-byte change of a real address is either refused or leaves
// an address UCX can take; those that change only the header or the
// worker uuid are connected here, in this process: nothing aborts.
TEST_F(UcxGarbageTest, MutatedAddressesNeverReachUcxBroken) {
  int refused = 0, accepted = 0;
  for (size_t i = 0; i < own_.size(); ++i) {
    for (int v : {0x00, 0xff, 0x80, 0x7f, 0x3f, 0x40, 0x20, 0x1f}) {
      std::string s = own_;
      if (s[i] == static_cast<char>(v)) continue;
      s[i] = static_cast<char>(v);
      const absl::Status st = worker_->ValidatePeerAddress(s);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
        ++refused;
        continue;
      }
      ++accepted;
      if (i < 9) {
        EXPECT_TRUE(worker_->Connect(2, s).ok()) << "byte " << i;
      }
    }
  }
  std::printf("single-byte mutations: %d refused, %d accepted\n", refused, accepted);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace hsap::transport

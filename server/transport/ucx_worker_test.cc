// The rendezvous threshold UcxWorker gives UCX (ucx_worker.h,
// EagerRndvThresh): eager at every size over TCP, UCX's own elsewhere, the
// operator's choice (option or environment) first.
#include "server/transport/ucx_worker.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsap::transport {
namespace {

TEST(EagerRndvThreshTest, TcpWithSameNodeTransportsIsEager) {
  EXPECT_EQ(EagerRndvThresh("tcp"), "inf");
  EXPECT_EQ(EagerRndvThresh("tcp,self"), "inf");
  EXPECT_EQ(EagerRndvThresh("posix, sysv,cma,self,tcp"), "inf");
  EXPECT_EQ(EagerRndvThresh("shm,tcp"), "inf");
}

TEST(EagerRndvThreshTest, RdmaUnnamedOrNoNetworkKeepsUcxsThreshold) {
  EXPECT_EQ(EagerRndvThresh(""), "");
  EXPECT_EQ(EagerRndvThresh("rc,tcp"), "");
  EXPECT_EQ(EagerRndvThresh("tcp,ud_x,self"), "");
  EXPECT_EQ(EagerRndvThresh("all"), "");
  EXPECT_EQ(EagerRndvThresh("posix,sysv,cma,self"), "");
  EXPECT_EQ(EagerRndvThresh("\\tcp"), "");  // UCX_TLS's exclusion syntax: not only tcp
}

TEST(TransportInUseTest, NamedAliasedAllOrNotExcluded) {
  EXPECT_TRUE(TransportInUse("", "posix"));  // UCX's choice: anything
  EXPECT_TRUE(TransportInUse("all", "sysv"));
  EXPECT_TRUE(TransportInUse("posix,sysv,cma,self", "posix"));
  EXPECT_TRUE(TransportInUse("tcp, sysv", "sysv"));
  EXPECT_TRUE(TransportInUse("sm,tcp", "posix"));
  EXPECT_TRUE(TransportInUse("shm", "sysv"));
  EXPECT_TRUE(TransportInUse("^tcp", "posix"));
  EXPECT_FALSE(TransportInUse("tcp", "posix"));
  EXPECT_FALSE(TransportInUse("tcp,self", "sysv"));
  EXPECT_FALSE(TransportInUse("sm", "tcp"));
  EXPECT_FALSE(TransportInUse("^posix,tcp", "posix"));
  EXPECT_FALSE(TransportInUse("\\sm", "sysv"));
}

TEST(UcxWorkerEnvironmentTest, SetsOnlyTheVariablesOfTransportsInUse) {
  ::unsetenv("UCX_POSIX_ERROR_HANDLING");
  ::unsetenv("UCX_SYSV_ERROR_HANDLING");
  auto tcp = UcxWorker::Create({.transports = "tcp"});
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(std::getenv("UCX_POSIX_ERROR_HANDLING"), nullptr);
  EXPECT_EQ(std::getenv("UCX_SYSV_ERROR_HANDLING"), nullptr);
  auto posix = UcxWorker::Create({.transports = "posix,cma,self"});
  ASSERT_TRUE(posix.ok()) << posix.status();
  ASSERT_NE(std::getenv("UCX_POSIX_ERROR_HANDLING"), nullptr);
  EXPECT_STREQ(std::getenv("UCX_POSIX_ERROR_HANDLING"), "y");
  EXPECT_EQ(std::getenv("UCX_SYSV_ERROR_HANDLING"), nullptr);
  ::unsetenv("UCX_POSIX_ERROR_HANDLING");
}

class UcxWorkerRndvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(std::getenv("UCX_RNDV_THRESH"), nullptr); }
  void TearDown() override { ::unsetenv("UCX_RNDV_THRESH"); }
};

TEST_F(UcxWorkerRndvTest, AppliesTheRuleTheOptionAndLeavesTheEnvironmentsValue) {
  auto tcp = UcxWorker::Create({.transports = "tcp,self"});
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ((*tcp)->rndv_thresh(), "inf");
  auto shm = UcxWorker::Create({.transports = "posix,sysv,cma,self"});
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ((*shm)->rndv_thresh(), "");
  auto sized = UcxWorker::Create({.transports = "tcp", .rndv_thresh = "65536"});
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)->rndv_thresh(), "65536");
  ::setenv("UCX_RNDV_THRESH", "8192", 1);
  auto env = UcxWorker::Create({.transports = "tcp", .rndv_thresh = "inf"});
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ((*env)->rndv_thresh(), "");  // the operator's UCX_RNDV_THRESH won
}

TEST_F(UcxWorkerRndvTest, AValueUcxRefusesFailsCreate) {
  auto w = UcxWorker::Create({.transports = "tcp", .rndv_thresh = "lots"});
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()), ::testing::HasSubstr("RNDV_THRESH=lots"));
}

}  // namespace
}  // namespace hsap::transport

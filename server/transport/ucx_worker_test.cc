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

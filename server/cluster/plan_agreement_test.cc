#include "server/cluster/plan_agreement.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsap::cluster {
namespace {

using ::testing::HasSubstr;

TEST(PlanAgreement, AgreeMismatchAndNotSeenYet) {
  PlanAgreement table;
  const CallKey call{"g", 7, false};
  // A peer states its key before this node saw the call: "not seen yet".
  EXPECT_EQ(table.OnRemote(call, 1, "K1"), "");
  EXPECT_TRUE(table.SetLocal(call, "K1").ok());
  EXPECT_EQ(table.OnRemote(call, 2, "K1"), "K1");  // agreed
  EXPECT_EQ(table.OnRemote(call, 3, "K9"), "K1");  // mismatch: ours comes back
  // The backward pass is another call.
  EXPECT_EQ(table.OnRemote({"g", 7, true}, 1, "K1"), "");
}

TEST(PlanAgreement, LocalAfterDifferentRemoteFails) {
  PlanAgreement table;
  const CallKey call{"g", 8, false};
  table.OnRemote(call, 2, "B");
  const absl::Status s = table.SetLocal(call, "A");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 2 runs B"));
}

TEST(PlanAgreement, BoundedTable) {
  PlanAgreement table(/*max_calls=*/4);
  for (uint64_t seq = 0; seq < 10; ++seq) EXPECT_TRUE(table.SetLocal({"g", seq, false}, "K").ok());
  EXPECT_EQ(table.OnRemote({"g", 9, false}, 1, "K"), "K");  // recent: kept
  EXPECT_EQ(table.OnRemote({"g", 0, false}, 1, "K"), "");   // oldest: forgotten
}

}  // namespace
}  // namespace hsap::cluster

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

TEST(PlanAgreement, ReceiveCommIdsAndAGroupNameUsedAgain) {
  PlanAgreement table;
  const CallKey call{"g", 1, false};
  uint32_t comm = 1000;
  EXPECT_EQ(table.OnRemote(call, 1, "K", 9, &comm), "");  // not seen yet: no id
  EXPECT_EQ(comm, 1000u);
  EXPECT_TRUE(table.SetLocal(call, "K", 5).ok());
  EXPECT_EQ(table.OnRemote(call, 1, "K", 9, &comm), "K");
  EXPECT_EQ(comm, 5u);
  // Ended: a peer that asks late (first time, or again with its id) still
  // gets the answer.
  table.EndLocal("g", 1);
  comm = 1000;
  EXPECT_EQ(table.OnRemote(call, 2, "K", 4, &comm), "K");
  EXPECT_EQ(comm, 5u);
  EXPECT_EQ(table.OnRemote(call, 1, "K", 9, &comm), "K");
  // Node 1 states another id for the same call: a new group of that name.
  // The old entry, and its receive id 5, must not be handed out.
  comm = 1000;
  EXPECT_EQ(table.OnRemote(call, 1, "K", 8, &comm), "");
  EXPECT_EQ(comm, 1000u);
  EXPECT_TRUE(table.SetLocal(call, "K", 6).ok());
  EXPECT_EQ(table.OnRemote(call, 2, "K", 4, &comm), "K");
  EXPECT_EQ(comm, 6u);
  // While the call is live nothing is forgotten.
  EXPECT_EQ(table.OnRemote(call, 1, "K", 3, &comm), "K");
  EXPECT_EQ(comm, 6u);
  // EndLocal covers both directions and leaves other calls alone.
  EXPECT_TRUE(table.SetLocal({"g", 1, true}, "B", 7).ok());
  EXPECT_TRUE(table.SetLocal({"g", 2, false}, "K", 2).ok());
  EXPECT_EQ(table.OnRemote({"g", 1, true}, 1, "B", 11), "B");
  EXPECT_EQ(table.OnRemote({"g", 2, false}, 1, "K", 11), "K");
  table.EndLocal("g", 1);
  EXPECT_EQ(table.OnRemote({"g", 1, true}, 1, "B", 12), "");   // ended, id changed
  EXPECT_EQ(table.OnRemote({"g", 2, false}, 1, "K", 12), "K");  // live
}

TEST(PlanAgreement, BoundedTable) {
  PlanAgreement table(/*max_calls=*/4);
  for (uint64_t seq = 0; seq < 10; ++seq) EXPECT_TRUE(table.SetLocal({"g", seq, false}, "K").ok());
  EXPECT_EQ(table.OnRemote({"g", 9, false}, 1, "K"), "K");  // recent: kept
  EXPECT_EQ(table.OnRemote({"g", 0, false}, 1, "K"), "");   // oldest: forgotten
}

}  // namespace
}  // namespace hsap::cluster

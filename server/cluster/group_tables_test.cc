// The peer layer's tables (peer_table.h, group_table.h) and the JoinGroup
// validation (peer_validation.h): plain data, no RPCs.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/group_table.h"
#include "server/cluster/peer_table.h"
#include "server/cluster/peer_validation.h"

namespace hsap::cluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(PeerTableTest, RuntimePeersAreReferenceCountedAndKeepTheirIds) {
  PeerTable t(8);
  EXPECT_EQ(t.AddPinned("h:1", /*self=*/true)->id, 0);
  EXPECT_EQ(t.AddPinned("h:2", false)->id, 1);
  auto a = t.Reference("h:9", nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->id, 2);
  EXPECT_FALSE((*a)->pinned);
  auto again = t.Reference("h:9", nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
  EXPECT_EQ((*a)->references, 2);
  EXPECT_EQ(t.runtime_peers(), 1);
  // Pinned peers take no reference and never expire.
  ASSERT_TRUE(t.Reference("h:2", nullptr).ok());
  EXPECT_EQ(t.FindAddress("h:2")->references, 0);

  t.Unreference(2, kT0);
  EXPECT_TRUE(t.TakeExpired(kT0 + absl::Hours(1), absl::Seconds(5)).empty());  // still 1 ref
  t.Unreference(2, kT0);
  EXPECT_EQ((*a)->references, 0);
  EXPECT_TRUE(t.TakeExpired(kT0 + absl::Seconds(4), absl::Seconds(5)).empty());  // lingering
  auto gone = t.TakeExpired(kT0 + absl::Seconds(5), absl::Seconds(5));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0]->address, "h:9");
  EXPECT_EQ(t.FindAddress("h:9"), nullptr);
  EXPECT_EQ(t.Find(2), nullptr);
  EXPECT_EQ(t.runtime_peers(), 0);
  // Back again: its old id (the endpoint was parked, not closed), and what
  // it was connected to.
  EXPECT_EQ(t.parked(), 1);
  auto back = t.Reference("h:9", nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->id, 2);
  EXPECT_EQ(t.parked(), 0);
  EXPECT_EQ(t.All().size(), 3u);
  EXPECT_EQ(t.Reference("h:10", nullptr).value()->id, 3);
  // A referenced peer is not released, whatever the time.
  EXPECT_TRUE(t.TakeExpired(kT0 + absl::Hours(9), absl::Seconds(5)).empty());
}

// Parked endpoints beyond --max_peers are closed, oldest first.
TEST(PeerTableTest, ParkedEndpointsBeyondMaxPeersAreClosedOldestFirst) {
  PeerTable t(1);
  t.AddPinned("self:1", true);
  std::vector<int32_t> close;
  // a:1 (id 1) parks at +5 s, b:1 (id 2) at +15 s: two parked, limit 1.
  absl::Time at = kT0;
  for (const char* address : {"a:1", "b:1"}) {
    auto p = t.Reference(address, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    (*p)->connected_incarnation = 7;
    t.Unreference((*p)->id, at);
    EXPECT_EQ(t.TakeExpired(at + absl::Seconds(5), absl::Seconds(5), &close).size(), 1u);
    at += absl::Seconds(10);
  }
  EXPECT_EQ(close, std::vector<int32_t>{1});  // the oldest, a:1
  EXPECT_EQ(t.parked(), 1);
  auto back = t.Reference("b:1", nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->id, 2);
  EXPECT_EQ((*back)->connected_incarnation, 7u);
  t.Unreference(2, at);
  t.TakeExpired(at + absl::Seconds(5), absl::Seconds(5), &close);
  // The closed one comes back under a new id, connected to nothing.
  auto fresh = t.Reference("a:1", nullptr);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->id, 3);
  EXPECT_EQ((*fresh)->connected_incarnation, 0u);
}

TEST(PeerTableTest, MaxPeersRefusesNamingTheFlag) {
  PeerTable t(2);
  t.AddPinned("self:1", true);
  ASSERT_TRUE(t.Reference("a:1", nullptr).ok());
  ASSERT_TRUE(t.Reference("b:1", nullptr).ok());
  ASSERT_TRUE(t.Reference("a:1", nullptr).ok());  // known: no new peer
  auto refused = t.Reference("c:1", nullptr);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("already references 2 run-time peers, the "
                                                    "limit (--max_peers); 'c:1'"));
  EXPECT_EQ(t.FindAddress("c:1"), nullptr);
}

TEST(GroupTableTest, OneNameOneMemberList) {
  GroupTable t(4);
  bool added = false;
  auto g = t.FindOrAdd("A", {"h:1", "h:2"}, 1, &added);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(added);
  EXPECT_EQ((*g)->state, GroupState::kForming);
  auto same = t.FindOrAdd("A", {"h:1", "h:2"}, 1, &added);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(added);
  EXPECT_EQ(*same, *g);
  auto other = t.FindOrAdd("A", {"h:1", "h:3"}, 1, &added);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(),
              HasSubstr("group 'A' was formed on this daemon with call.nodes [h:1, h:2] and "
                        "node_index 1; this call names [h:1, h:3] and node_index 1"));
  auto moved = t.FindOrAdd("A", {"h:1", "h:2"}, 0, &added);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GroupTableTest, MissingNamesTheMembersThatDidNotJoin) {
  GroupTable t;
  bool added;
  auto g = t.FindOrAdd("A", {"h:1", "h:2", "h:3"}, 0, &added);
  ASSERT_TRUE(g.ok());
  (*g)->members[0].joined = true;  // this node
  (*g)->members[2].joined = true;
  EXPECT_THAT((*g)->Missing(), ElementsAre("1 (h:2)"));
}

TEST(GroupTableTest, APeerLossFailsOnlyItsGroupsAndTheNameMustChange) {
  GroupTable t;
  bool added;
  auto a = t.FindOrAdd("A", {"h:0", "h:1"}, 1, &added);
  auto b = t.FindOrAdd("B", {"h:1", "h:2"}, 0, &added);
  auto c = t.FindOrAdd("C", {"h:0", "h:1"}, 1, &added);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  (*a)->members = {{"h:0", 7, 111, "", true}, {"h:1", 0, 5, "", true}};
  (*b)->members = {{"h:1", 0, 5, "", true}, {"h:2", 8, 222, "", true}};
  // C formed with peer 7's newer incarnation.
  (*c)->members = {{"h:0", 7, 333, "", true}, {"h:1", 0, 5, "", true}};
  (*a)->state = (*b)->state = (*c)->state = GroupState::kUp;
  // Peer 7 restarted from incarnation 111: A knew it, C already has 333.
  EXPECT_EQ(t.FailWithPeer(7, 111, absl::AbortedError("node h:0 restarted")), 1);
  EXPECT_EQ((*a)->state, GroupState::kFailed);
  EXPECT_EQ((*b)->state, GroupState::kUp);
  EXPECT_EQ((*c)->state, GroupState::kUp);
  // This node (peer 0, its own place) never fails its groups.
  EXPECT_EQ(t.FailWithPeer(0, 0, absl::UnavailableError("x")), 0);
  EXPECT_EQ(t.CountByState(), (std::array<int, 3>{0, 2, 1}));
  // A's later calls: a new group name.
  auto later = t.FindOrAdd("A", {"h:0", "h:1"}, 1, &added);
  ASSERT_EQ(later.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(later.status().message(),
              HasSubstr("group 'A' failed (node h:0 restarted); form the group again under a "
                        "new group name"));
  // Released (its sessions closed), the name starts afresh.
  EXPECT_NE(t.Remove("A"), nullptr);
  EXPECT_EQ(t.Remove("A"), nullptr);
  auto fresh = t.FindOrAdd("A", {"h:0", "h:1"}, 1, &added);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(added);
}

TEST(GroupTableTest, FullTableRefusesNamingTheFlag) {
  GroupTable t(2);
  bool added;
  ASSERT_TRUE(t.FindOrAdd("A", {"h:0", "h:1"}, 0, &added).ok());
  ASSERT_TRUE(t.FindOrAdd("B", {"h:0", "h:1"}, 0, &added).ok());
  auto refused = t.FindOrAdd("C", {"h:0", "h:1"}, 0, &added);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("2 multi-node groups, the limit "
                                                    "(--max_call_groups); group 'C'"));
  ASSERT_TRUE(t.FindOrAdd("A", {"h:0", "h:1"}, 0, &added).ok());  // known: fine
}

v1::JoinGroupRequest GoodJoin() {
  v1::JoinGroupRequest r;
  r.set_group("A");
  r.add_nodes("10.0.0.1:7000");
  r.add_nodes("10.0.0.2:7000");
  r.set_node_index(1);
  r.set_address("10.0.0.2:7000");
  r.set_incarnation(42);
  return r;
}

TEST(JoinGroupValidationTest, NamesTheFieldAndTheValue) {
  ASSERT_TRUE(ValidateJoinGroupRequest(GoodJoin(), nullptr).ok());
  struct Case {
    std::function<void(v1::JoinGroupRequest*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->set_group(""); }, "group: empty"},
      {[](auto* r) { r->clear_nodes(); r->add_nodes("10.0.0.2:7000"); r->set_node_index(0); },
       "nodes has 1 entries; a multi-node group has 2 to 4096"},
      {[](auto* r) { r->set_nodes(0, "nohost"); }, "nodes[0] is 'nohost': has no host:port"},
      {[](auto* r) { r->set_nodes(0, "10.0.0.2:7000"); },
       "nodes[1] '10.0.0.2:7000' repeats nodes[0]"},
      {[](auto* r) { r->set_node_index(0); }, "node_index is 0; a member joining the root is in "
                                              "[1, 2)"},
      {[](auto* r) { r->set_node_index(2); }, "node_index is 2"},
      {[](auto* r) { r->set_address("10.0.0.3:7000"); },
       "address is '10.0.0.3:7000' but nodes[1] is '10.0.0.2:7000'"},
      {[](auto* r) { r->set_incarnation(0); }, "incarnation is 0"},
      {[](auto* r) { r->set_ucx_worker_address(std::string(9000, 'x')); },
       "ucx_worker_address has 9000 bytes"},
  };
  for (const Case& k : cases) {
    v1::JoinGroupRequest r = GoodJoin();
    k.edit(&r);
    const absl::Status st = ValidateJoinGroupRequest(r, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << k.message << ": " << st;
    EXPECT_THAT(st.message(), HasSubstr(k.message));
  }
}

TEST(JoinGroupValidationTest, TheRootsAnswerMustMatchTheMembers) {
  const std::vector<std::string> nodes = {"10.0.0.1:7000", "10.0.0.2:7000"};
  v1::JoinGroupResponse r;
  r.set_formed(true);
  r.set_group_uid(9);
  r.set_group_key(std::string(16, 'k'));
  for (const auto& n : nodes) {
    auto* m = r.add_members();
    m->set_address(n);
    m->set_incarnation(5);
  }
  ASSERT_TRUE(ValidateJoinGroupResponse(r, nodes, nullptr).ok());
  v1::JoinGroupResponse keyless = r;
  keyless.clear_group_key();
  EXPECT_THAT(ValidateJoinGroupResponse(keyless, nodes, nullptr).message(),
              HasSubstr("group_key has 0 bytes; a group's key has 16"));
  v1::JoinGroupResponse swapped = r;
  swapped.mutable_members(0)->set_address("10.0.0.9:7000");
  EXPECT_THAT(ValidateJoinGroupResponse(swapped, nodes, nullptr).message(),
              HasSubstr("members[0].address is '10.0.0.9:7000' but the group's node 0 is "
                        "'10.0.0.1:7000'"));
  v1::JoinGroupResponse zero = r;
  zero.mutable_members(1)->set_incarnation(0);
  EXPECT_THAT(ValidateJoinGroupResponse(zero, nodes, nullptr).message(),
              HasSubstr("members[1].incarnation is 0"));
  v1::JoinGroupResponse short_list = r;
  short_list.mutable_members()->RemoveLast();
  EXPECT_THAT(ValidateJoinGroupResponse(short_list, nodes, nullptr).message(),
              HasSubstr("members has 1 entries; the group has 2 nodes"));
  v1::JoinGroupResponse no_uid = r;
  no_uid.set_group_uid(0);
  EXPECT_THAT(ValidateJoinGroupResponse(no_uid, nodes, nullptr).message(),
              HasSubstr("group_uid is 0"));
}

}  // namespace
}  // namespace hsap::cluster

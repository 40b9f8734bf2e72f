#include "server/grpc/call_nodes.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsap {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A daemon advertised as 127.0.0.1:7001 with 2 device slots and no static
// cluster (the addresses of a call need not be in --peers).
ValidationLimits Limits() {
  ValidationLimits l;
  l.max_group_size = 2;
  l.self_address = "127.0.0.1:7001";
  l.device_slots = 2;
  return l;
}

hsap::v1::CallId Id(std::vector<std::string> nodes, int32_t node_index, int32_t rank,
                    int32_t group_size) {
  hsap::v1::CallId id;
  id.set_group("g");
  id.set_call_seq(1);
  id.set_rank(rank);
  id.set_group_size(group_size);
  for (auto& n : nodes) id.add_nodes(n);
  id.set_node_index(node_index);
  return id;
}

absl::Status Resolve(const hsap::v1::CallId& id, const ValidationLimits& limits = Limits()) {
  AttentionCall call;
  return ResolveCallNodes(id, limits, &call);
}

TEST(CallNodesTest, KeepsTheMembersInGroupOrder) {
  AttentionCall call;
  // Group node 0 is another daemon (a run-time peer), group node 1 this one.
  ASSERT_TRUE(ResolveCallNodes(Id({"10.0.0.9:7002", "127.0.0.1:7001"}, 1, 3, 4), Limits(), &call)
                  .ok());
  EXPECT_THAT(call.member_addresses, ElementsAre("10.0.0.9:7002", "127.0.0.1:7001"));
  EXPECT_EQ(call.node_index, 1);
}

TEST(CallNodesTest, EmptyNodesKeepsTheOldRule) {
  AttentionCall call;
  call.member_addresses = {"x:1"};
  ASSERT_TRUE(ResolveCallNodes(Id({}, 0, 1, 2), Limits(), &call).ok());
  EXPECT_TRUE(call.member_addresses.empty());
  absl::Status st = Resolve(Id({}, 1, 1, 2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("call.node_index is 1 but call.nodes is empty"));
}

TEST(CallNodesTest, RefusesEachMistakeNamingTheField) {
  struct Case {
    hsap::v1::CallId id;
    absl::StatusCode code;
    std::string message;
  };
  const std::string a = "127.0.0.1:7000", b = "127.0.0.1:7001", c = "127.0.0.1:7002";
  const std::vector<Case> cases = {
      {Id({b, b}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] '127.0.0.1:7001' is the same node as call.nodes[0]"},
      {Id({b, "127.0.0.1"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is '127.0.0.1': has no host:port"},
      {Id({b, "h:0"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is 'h:0': has a port outside 1..65535"},
      {Id({b, "h:70000"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is 'h:70000': has a port outside 1..65535"},
      {Id({b, "h x:1"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is 'h x:1': holds a space"},
      {Id({b, ":7000"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is ':7000': has no host:port"},
      {Id({b, std::string(300, 'h') + ":1"}, 0, 0, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] is 'hhhh"},
      {Id({a, b}, 1, 2, 3), absl::StatusCode::kInvalidArgument,
       "call.group_size is 3 but call.nodes has 2 entries"},
      {Id({a, b}, 1, 3, 6), absl::StatusCode::kInvalidArgument,
       "puts 3 ranks on each node but this daemon has 2 device slot(s)"},
      {Id({a, b}, 2, 1, 2), absl::StatusCode::kInvalidArgument,
       "call.node_index is 2; it must be in [0, 2)"},
      {Id({a, b}, -1, 1, 2), absl::StatusCode::kInvalidArgument,
       "call.node_index is -1; it must be in [0, 2)"},
      // Byte for byte: localhost is not 127.0.0.1.
      {Id({a, "localhost:7001"}, 1, 1, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] (call.node_index) is 'localhost:7001' but this daemon's advertised "
       "address is '127.0.0.1:7001'"},
      {Id({a, c}, 1, 1, 2), absl::StatusCode::kInvalidArgument,
       "call.nodes[1] (call.node_index) is '127.0.0.1:7002' but this daemon's advertised "
       "address is '127.0.0.1:7001'"},
      {Id({a, b}, 1, 1, 4), absl::StatusCode::kInvalidArgument,
       "call.rank is 1 but call.node_index is 1: with 2 rank(s) per node, node 1 holds ranks "
       "[2, 4)"},
  };
  for (const Case& k : cases) {
    const absl::Status st = Resolve(k.id);
    EXPECT_EQ(st.code(), k.code) << k.message << ": " << st;
    EXPECT_THAT(st.message(), HasSubstr(k.message));
  }
}

TEST(CallNodesTest, TooManyNodesAreRefused) {
  std::vector<std::string> nodes;
  for (int i = 0; i < 4097; ++i) nodes.push_back("h:" + std::to_string(i + 1));
  const absl::Status st = Resolve(Id(nodes, 0, 0, 4097));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("call.nodes has 4097 entries; at most 4096"));
}

TEST(CallNodesTest, NodesWithoutTcpAreRefused) {
  ValidationLimits alone;
  alone.device_slots = 2;
  const absl::Status st = Resolve(Id({"127.0.0.1:7000"}, 0, 0, 1), alone);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("call.nodes names 1 node(s) but this daemon has no TCP "
                                      "address (started with --port 0)"));
}

}  // namespace
}  // namespace hsap

// From a validated attention call to the plan that runs it: the PlanSpec
// (mask, topology, shapes, strategy, assignment, cost profile), the plan
// from the daemon's cache, and the checks that tie the call's tensors to the
// plan's dispatch (this rank must hold exactly the tokens the plan gives it).
#ifndef HSAP_SERVER_EXEC_CALL_PLAN_H_
#define HSAP_SERVER_EXEC_CALL_PLAN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/exec/attention_call.h"
#include "server/plan/plan.h"
#include "server/plan/plan_cache.h"

namespace hsap {

// The topology a group of `group_size` ranks runs on: one node holding all
// ranks (group_size <= devices of this node), or every node of the cluster
// with `devices_per_node` ranks each. INVALID_ARGUMENT (naming
// call.group_size) otherwise.
absl::StatusOr<plan::Topology> GroupTopology(int32_t group_size, int32_t num_nodes,
                                            int32_t devices_per_node);

// Where a call's group lives.
struct GroupLayout {
  // nodes x ranks per node, for planning (rank r is on group node r / rpn).
  plan::Topology topology;
  // Static cluster index of each group node, in group node order; empty for
  // a multi-node group declared by call.nodes (its peers are resolved by
  // address when the call is matched).
  std::vector<int32_t> member_nodes;
  // This daemon's group node; it serves ranks [node_index * rpn, + rpn).
  int32_t node_index = 0;
  int32_t first_local_rank() const { return node_index * topology.devices_per_node; }
};

// The layout of `call` on this daemon (node `node_rank` of a `num_nodes`
// static cluster with `devices_per_node` slots): the declared member nodes
// (call.member_addresses, already validated: ResolveCallNodes), or without
// them GroupTopology's rule (one node, or every node of the cluster).
// INVALID_ARGUMENT as GroupTopology, or naming call.rank when the old rule
// puts the rank on another node.
absl::StatusOr<GroupLayout> LayoutForCall(const AttentionCall& call, int32_t num_nodes,
                                          int32_t devices_per_node, int32_t node_rank);

plan::PlanSpec SpecForCall(const AttentionCall& call, const plan::Topology& topology,
                           const std::string& profile);

// The plan of `call` (cached or compiled), checked against this rank's
// tensors: q.shape[0] must equal the tokens the dispatch gives the rank.
absl::StatusOr<std::shared_ptr<const plan::Plan>> PlanForCall(const AttentionCall& call,
                                                             const plan::Topology& topology,
                                                             const std::string& profile,
                                                             plan::PlanCache* cache,
                                                             bool* cache_hit);

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_CALL_PLAN_H_

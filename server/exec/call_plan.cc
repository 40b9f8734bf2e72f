#include "server/exec/call_plan.h"

#include "absl/strings/str_cat.h"

namespace hsap {

absl::StatusOr<plan::Topology> GroupTopology(int32_t group_size, int32_t num_nodes,
                                            int32_t devices_per_node) {
  plan::Topology t;
  if (group_size <= devices_per_node) {
    t.num_nodes = 1;
    t.devices_per_node = group_size;
    return t;
  }
  if (group_size == num_nodes * devices_per_node) {
    t.num_nodes = num_nodes;
    t.devices_per_node = devices_per_node;
    return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "call.group_size is ", group_size, " but this cluster serves groups of at most ",
      devices_per_node, " rank(s) on one node or exactly ", num_nodes * devices_per_node,
      " (", num_nodes, " node(s) x ", devices_per_node, " device slots)"));
}

absl::StatusOr<GroupLayout> LayoutForCall(const AttentionCall& call, int32_t num_nodes,
                                          int32_t devices_per_node, int32_t node_rank) {
  GroupLayout layout;
  if (!call.member_addresses.empty()) {
    const int32_t n = static_cast<int32_t>(call.member_addresses.size());
    layout.topology.num_nodes = n;
    layout.topology.devices_per_node = call.group_size / n;
    // One node: this one; several: the peer layer resolves the addresses
    // (Cluster::AcquireGroup) when the call is matched.
    if (n == 1) layout.member_nodes = {node_rank};
    layout.node_index = call.node_index;
    return layout;
  }
  auto topology = GroupTopology(call.group_size, num_nodes, devices_per_node);
  if (!topology.ok()) return topology.status();
  layout.topology = *topology;
  if (topology->num_nodes == 1) {
    layout.member_nodes = {node_rank};
    return layout;
  }
  if (call.rank / devices_per_node != node_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.rank is ", call.rank, " but this node (", node_rank, ") serves ranks [",
        node_rank * devices_per_node, ", ", (node_rank + 1) * devices_per_node, ") of a ",
        call.group_size, "-rank group"));
  }
  for (int32_t i = 0; i < num_nodes; ++i) layout.member_nodes.push_back(i);
  layout.node_index = node_rank;
  return layout;
}

plan::PlanSpec SpecForCall(const AttentionCall& call, const plan::Topology& topology,
                           const std::string& profile) {
  plan::PlanSpec spec;
  if (!call.cu_seqlens.empty()) {
    spec.cu_seqlens = call.cu_seqlens;
    spec.causal = call.causal;
    spec.window = call.causal ? call.window : -1;
  } else {
    spec.slices = call.slices;
  }
  spec.total_tokens = call.total_tokens;
  spec.topology = topology;
  spec.shape.num_heads_q = call.shape.num_heads_q;
  spec.shape.num_heads_kv = call.shape.num_heads_kv;
  spec.shape.head_dim = call.shape.head_dim;
  spec.shape.dtype = call.shape.dtype;
  spec.strategy = call.strategy;
  spec.assignment = call.assignment;
  spec.profile = profile;
  return spec;
}

absl::StatusOr<std::shared_ptr<const plan::Plan>> PlanForCall(const AttentionCall& call,
                                                             const plan::Topology& topology,
                                                             const std::string& profile,
                                                             plan::PlanCache* cache,
                                                             bool* cache_hit) {
  // The compile stops once the caller has gone.
  const std::function<bool()> stop = call.cancelled;
  auto p = cache->GetOrCompile(SpecForCall(call, topology, profile), cache_hit,
                               call.cancelled ? &stop : nullptr);
  if (!p.ok()) return p.status();
  const plan::RankPlan& rp = (*p)->ranks[call.rank];
  if (rp.stats.tokens != call.local_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q.shape[0] is ", call.local_tokens, " but the plan's dispatch gives rank ", call.rank,
        " of ", call.group_size, " ", rp.stats.tokens,
        " tokens (lay tokens out as Plans.Dispatch says for this mask and options)"));
  }
  return p;
}

}  // namespace hsap

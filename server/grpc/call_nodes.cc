#include "server/grpc/call_nodes.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/cluster/node_address.h"

namespace hsap {

absl::Status ResolveCallNodes(const hsap::v1::CallId& id, const ValidationLimits& limits,
                              AttentionCall* call) {
  call->member_addresses.clear();
  call->node_index = 0;
  if (id.nodes().empty()) {
    if (id.node_index() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "call.node_index is ", id.node_index(), " but call.nodes is empty (no member list)"));
    }
    return absl::OkStatus();
  }
  const int64_t n = id.nodes_size();
  if (n > cluster::kMaxGroupNodes) {
    return absl::InvalidArgumentError(absl::StrCat("call.nodes has ", n, " entries; at most ",
                                                   cluster::kMaxGroupNodes));
  }
  for (int64_t i = 0; i < n; ++i) {
    const std::string& address = id.nodes(i);
    HSAP_RETURN_IF_ERROR(cluster::ValidateNodeAddress(absl::StrCat("call.nodes[", i, "]"), address));
    for (int64_t j = 0; j < i; ++j) {
      if (id.nodes(j) == address) {
        return absl::InvalidArgumentError(absl::StrCat("call.nodes[", i, "] '", address,
                                                       "' is the same node as call.nodes[", j,
                                                       "]; each node appears once"));
      }
    }
  }
  if (id.group_size() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.group_size is ", id.group_size(), " but call.nodes has ", n,
        " entries: every node of a group holds the same number of ranks"));
  }
  const int32_t rpn = static_cast<int32_t>(id.group_size() / n);
  if (rpn > limits.device_slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.group_size ", id.group_size(), " over ", n, " node(s) puts ", rpn,
        " ranks on each node but this daemon has ", limits.device_slots, " device slot(s)"));
  }
  if (id.node_index() < 0 || id.node_index() >= n) {
    return absl::InvalidArgumentError(absl::StrCat("call.node_index is ", id.node_index(),
                                                   "; it must be in [0, ", n,
                                                   ") (call.nodes has ", n, " entries)"));
  }
  if (limits.self_address.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "call.nodes names ", n, " node(s) but this daemon has no TCP address (started with "
        "--port 0): a daemon named in call.nodes serves peers over TCP"));
  }
  if (id.nodes(id.node_index()) != limits.self_address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.nodes[", id.node_index(), "] (call.node_index) is '", id.nodes(id.node_index()),
        "' but this daemon's advertised address is '", limits.self_address,
        "' (--advertise_address; GetClusterStatus self_address)"));
  }
  if (id.rank() / rpn != id.node_index()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.rank is ", id.rank(), " but call.node_index is ", id.node_index(), ": with ", rpn,
        " rank(s) per node, node ", id.node_index(), " holds ranks [", id.node_index() * rpn,
        ", ", (id.node_index() + 1) * rpn, ")"));
  }
  call->member_addresses.assign(id.nodes().begin(), id.nodes().end());
  call->node_index = id.node_index();
  return absl::OkStatus();
}

}  // namespace hsap

#include "server/cluster/peer_validation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/transport/ucx_address.h"
#include "server/transport/ucx_tag.h"

namespace hsap::cluster {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

bool Printable(absl::string_view s) {
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

absl::Status CheckUcx(absl::string_view address, const UcxAddressCheck& ucx) {
  if (address.size() > transport::kMaxUcxAddressBytes) {
    return Invalid("ucx_worker_address", absl::StrCat("has ", address.size(), " bytes; at most ",
                                                      transport::kMaxUcxAddressBytes));
  }
  if (!ucx) return absl::OkStatus();  // no UCX here: never used
  if (address.empty()) {
    return Invalid("ucx_worker_address", "is empty but this node's data plane is UCX");
  }
  absl::Status st = ucx(address);
  if (!st.ok()) {
    // The validator's messages start with the field name already.
    return absl::InvalidArgumentError(st.message());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePeerUcxAddress(absl::string_view address, const UcxAddressCheck& ucx) {
  return CheckUcx(address, ucx);
}

absl::Status ValidateJoinRequest(const v1::JoinRequest& r, const ClusterShape& shape,
                                 const UcxAddressCheck& ucx) {
  if (r.num_nodes() < 1 || r.num_nodes() > kMaxPeerNodes) {
    return Invalid("num_nodes", absl::StrCat("is ", r.num_nodes(), "; 1 to ", kMaxPeerNodes));
  }
  if (r.node_rank() < 0 || r.node_rank() >= r.num_nodes()) {
    return Invalid("node_rank", absl::StrCat("is ", r.node_rank(), " but num_nodes is ",
                                             r.num_nodes()));
  }
  if (r.devices_per_node() < 1 || r.devices_per_node() > kMaxPeerDevicesPerNode) {
    return Invalid("devices_per_node", absl::StrCat("is ", r.devices_per_node(), "; 1 to ",
                                                    kMaxPeerDevicesPerNode));
  }
  if (r.incarnation() == 0) return Invalid("incarnation", "is 0; a started node draws a non-zero one");
  if (r.version().size() > kMaxPeerVersionBytes || !Printable(r.version())) {
    return Invalid("version", absl::StrCat("must be 0 to ", kMaxPeerVersionBytes,
                                           " printable ASCII characters (", r.version().size(),
                                           " bytes given)"));
  }
  HSAP_RETURN_IF_ERROR(CheckUcx(r.ucx_worker_address(), ucx));
  if (r.num_nodes() != shape.num_nodes || r.node_rank() == shape.self ||
      r.devices_per_node() != shape.devices_per_node) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Join from node ", r.node_rank(), " of ", r.num_nodes(), " with ", r.devices_per_node(),
        " devices per node; this is node ", shape.self, " of ", shape.num_nodes, " with ",
        shape.devices_per_node));
  }
  return absl::OkStatus();
}

absl::Status ValidateJoinResponse(const v1::JoinResponse& r, int32_t node,
                                  const UcxAddressCheck& ucx) {
  if (r.node_rank() != node) {
    return Invalid("node_rank", absl::StrCat("is ", r.node_rank(), " in the answer of node ", node));
  }
  if (r.incarnation() == 0) return Invalid("incarnation", "is 0");
  if (r.nccl_unique_id().size() > 128) {
    return Invalid("nccl_unique_id", absl::StrCat("has ", r.nccl_unique_id().size(),
                                                  " bytes; an NCCL unique id has 128"));
  }
  return CheckUcx(r.ucx_worker_address(), ucx);
}

absl::Status ValidateCallFields(absl::string_view group, const std::string* plan_key) {
  if (group.empty()) return absl::InvalidArgumentError("group: empty");
  if (group.size() > kMaxPeerGroupBytes) {
    return Invalid("group", absl::StrCat("has ", group.size(), " bytes; at most ", kMaxPeerGroupBytes));
  }
  if (plan_key != nullptr) {
    if (plan_key->empty()) return absl::InvalidArgumentError("plan_key: empty");
    if (plan_key->size() > kMaxPeerPlanKeyBytes || !Printable(*plan_key)) {
      return Invalid("plan_key", absl::StrCat("must be 1 to ", kMaxPeerPlanKeyBytes,
                                              " printable characters (", plan_key->size(),
                                              " bytes given)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAbortFields(const v1::AbortCallRequest& r) {
  HSAP_RETURN_IF_ERROR(ValidateCallFields(r.group(), nullptr));
  if (r.code() < 0 || r.code() > 16) {
    return Invalid("code", absl::StrCat("is ", r.code(), "; a gRPC status code is 0 to 16"));
  }
  if (r.message().size() > kMaxPeerMessageBytes) {
    return Invalid("message", absl::StrCat("has ", r.message().size(), " bytes; at most ",
                                           kMaxPeerMessageBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateRecvCommId(uint32_t recv_comm_id) {
  static_assert(kMaxPeerCommIds == transport::ucx_tag::kMaxComms);
  if (recv_comm_id >= kMaxPeerCommIds) {
    return Invalid("recv_comm_id", absl::StrCat("is ", recv_comm_id, "; a UCX communicator id is < ",
                                                kMaxPeerCommIds));
  }
  return absl::OkStatus();
}

absl::Status ValidateMemberNodes(absl::string_view group, const std::vector<int32_t>& members,
                                 int32_t num_nodes, int32_t self) {
  for (int32_t m : members) {
    if (m < 0 || m >= num_nodes) {
      return absl::InvalidArgumentError(absl::StrCat("plan agreement for group '", group,
                                                     "': member node ", m, " is not a node of the ",
                                                     num_nodes, "-node cluster"));
    }
  }
  if (!members.empty() && std::find(members.begin(), members.end(), self) == members.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan agreement for group '", group, "': its members (", absl::StrJoin(members, ", "),
        ") do not include this node (", self, ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateJoinGroupRequest(const v1::JoinGroupRequest& r, const UcxAddressCheck& ucx) {
  HSAP_RETURN_IF_ERROR(ValidateCallFields(r.group(), nullptr));
  const int n = r.nodes_size();
  if (n < 2 || n > kMaxGroupNodes) {
    return Invalid("nodes", absl::StrCat("has ", n, " entries; a multi-node group has 2 to ",
                                         kMaxGroupNodes));
  }
  for (int i = 0; i < n; ++i) {
    HSAP_RETURN_IF_ERROR(ValidateNodeAddress(absl::StrCat("nodes[", i, "]"), r.nodes(i)));
    for (int j = 0; j < i; ++j) {
      if (r.nodes(j) == r.nodes(i)) {
        return Invalid(absl::StrCat("nodes[", i, "]"),
                       absl::StrCat("'", r.nodes(i), "' repeats nodes[", j, "]"));
      }
    }
  }
  if (r.node_index() < 1 || r.node_index() >= n) {
    return Invalid("node_index", absl::StrCat("is ", r.node_index(), "; a member joining the "
                                              "root is in [1, ", n, ")"));
  }
  if (r.address() != r.nodes(r.node_index())) {
    return Invalid("address", absl::StrCat("is '", r.address().substr(0, 64), "' but nodes[",
                                           r.node_index(), "] is '", r.nodes(r.node_index()),
                                           "'"));
  }
  if (r.incarnation() == 0) return Invalid("incarnation", "is 0; a started node draws a non-zero one");
  if (r.version().size() > kMaxPeerVersionBytes || !Printable(r.version())) {
    return Invalid("version", absl::StrCat("must be 0 to ", kMaxPeerVersionBytes,
                                           " printable ASCII characters"));
  }
  if (r.nonce().size() > kMaxPeerNonceBytes) {
    return Invalid("nonce", absl::StrCat("has ", r.nonce().size(), " bytes; at most ",
                                         kMaxPeerNonceBytes));
  }
  if (r.refused_code() < 0 || r.refused_code() > 16) {
    return Invalid("refused_code", absl::StrCat("is ", r.refused_code(),
                                                "; a gRPC status code is 0 to 16"));
  }
  if (r.refused_message().size() > kMaxPeerMessageBytes) {
    return Invalid("refused_message", absl::StrCat("has ", r.refused_message().size(),
                                                   " bytes; at most ", kMaxPeerMessageBytes));
  }
  return CheckUcx(r.ucx_worker_address(), ucx);
}

absl::Status ValidateJoinGroupResponse(const v1::JoinGroupResponse& r,
                                       const std::vector<std::string>& nodes,
                                       const UcxAddressCheck& ucx) {
  if (r.members_size() != static_cast<int>(nodes.size())) {
    return Invalid("members", absl::StrCat("has ", r.members_size(), " entries; the group has ",
                                           nodes.size(), " nodes"));
  }
  for (int i = 0; i < r.members_size(); ++i) {
    const v1::GroupMember& m = r.members(i);
    if (m.address() != nodes[i]) {
      return Invalid(absl::StrCat("members[", i, "].address"),
                     absl::StrCat("is '", m.address().substr(0, 64), "' but the group's node ", i,
                                  " is '", nodes[i], "'"));
    }
    if (m.incarnation() == 0) return Invalid(absl::StrCat("members[", i, "].incarnation"), "is 0");
    HSAP_RETURN_IF_ERROR(CheckUcx(m.ucx_worker_address(), ucx));
  }
  if (r.group_uid() == 0) return Invalid("group_uid", "is 0");
  if (r.group_key().size() != kGroupKeyBytes) {
    return Invalid("group_key", absl::StrCat("has ", r.group_key().size(), " bytes; a group's key has ",
                                             kGroupKeyBytes));
  }
  return absl::OkStatus();
}

}  // namespace hsap::cluster

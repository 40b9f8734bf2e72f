// Validation of every field a peer sends on the hsap.v1.Peer service,
// before any of it reaches the cluster's state or a library (UCX).
//
// Field-level garbage is INVALID_ARGUMENT naming the field and the value;
// a well-formed request from a node configured differently (another node
// count or devices per node) stays FAILED_PRECONDITION, as before. Pure
// functions: thread-safe, no I/O.
#ifndef HSAP_SERVER_CLUSTER_PEER_VALIDATION_H_
#define HSAP_SERVER_CLUSTER_PEER_VALIDATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "hsap/v1/peer.pb.h"
#include "server/cluster/node_address.h"

namespace hsap::cluster {

inline constexpr int32_t kMaxPeerNodes = 1 << 16;
inline constexpr int32_t kMaxPeerDevicesPerNode = 1024;
inline constexpr size_t kMaxPeerVersionBytes = 128;
inline constexpr size_t kMaxPeerGroupBytes = 128;     // call.group's bound
inline constexpr size_t kMaxPeerPlanKeyBytes = 256;
inline constexpr size_t kMaxPeerMessageBytes = 4096;
inline constexpr uint32_t kMaxPeerCommIds = 1024;  // == transport::ucx_tag::kMaxComms
inline constexpr size_t kMaxPeerNonceBytes = 64;
inline constexpr size_t kGroupKeyBytes = 16;

// This node's view of the cluster.
struct ClusterShape {
  int32_t self = 0;
  int32_t num_nodes = 1;
  int32_t devices_per_node = 1;
};

// Checks UCX worker address bytes (UcxWorker::ValidatePeerAddress); null
// when this node has no UCX data plane (the address is then only bounded).
using UcxAddressCheck = std::function<absl::Status(absl::string_view address)>;

// A UCX worker address a peer sent (bounded; checked by `ucx` when set).
absl::Status ValidatePeerUcxAddress(absl::string_view address, const UcxAddressCheck& ucx);

// A Join from another node.
absl::Status ValidateJoinRequest(const v1::JoinRequest& request, const ClusterShape& shape,
                                 const UcxAddressCheck& ucx);
// The answer to our Join from node `node`.
absl::Status ValidateJoinResponse(const v1::JoinResponse& response, int32_t node,
                                  const UcxAddressCheck& ucx);
// The fields of AgreePlan / AbortCall besides node_rank (group, plan key,
// code, message); `plan_key` is null for AbortCall.
absl::Status ValidateCallFields(absl::string_view group, const std::string* plan_key);
absl::Status ValidateAbortFields(const v1::AbortCallRequest& request);
// AgreePlan's recv_comm_id (request and answer): a UCX communicator id,
// < kMaxPeerCommIds (ucx_tag.h's 10 comm bits).
absl::Status ValidateRecvCommId(uint32_t recv_comm_id);
// A call's member nodes (static indices, Cluster::AgreePlan): each in
// [0, num_nodes) and `self` among them; empty (every node) is valid.
// INVALID_ARGUMENT naming `group`, the index or the list otherwise.
absl::Status ValidateMemberNodes(absl::string_view group, const std::vector<int32_t>& members,
                                 int32_t num_nodes, int32_t self);

// A JoinGroup from a member (every field, the UCX address included):
// group named and bounded, 2 to kMaxGroupNodes valid distinct nodes,
// node_index in [1, nodes), address == nodes[node_index], a non-zero
// incarnation, bounded version, nonce and refusal (a status code and a
// message of at most kMaxPeerMessageBytes).
absl::Status ValidateJoinGroupRequest(const v1::JoinGroupRequest& request,
                                      const UcxAddressCheck& ucx);
// The root's formed answer to a JoinGroup for `nodes` (members in the same
// order, each with a non-zero incarnation and a valid UCX address; a
// kGroupKeyBytes key).
absl::Status ValidateJoinGroupResponse(const v1::JoinGroupResponse& response,
                                       const std::vector<std::string>& nodes,
                                       const UcxAddressCheck& ucx);

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_PEER_VALIDATION_H_

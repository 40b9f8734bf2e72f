// The member nodes a call declares (hsap.v1.CallId.nodes / node_index),
// checked against this daemon's static cluster (--peers) at the entry point.
//
// A group declared by its members has rpn = group_size / nodes_size ranks on
// each of its nodes, node-major: rank r is on group node r / rpn. Each
// daemon checks what it can see alone; that the member nodes agree with each
// other is left to the call matcher (this node's local ranks) and the plan
// agreement (the other nodes).
#ifndef HSAP_SERVER_GRPC_CALL_NODES_H_
#define HSAP_SERVER_GRPC_CALL_NODES_H_

#include "absl/status/status.h"
#include "hsap/v1/common.pb.h"
#include "server/exec/attention_call.h"

namespace hsap {

// Fills call->member_addresses, member_nodes (static indices) and
// node_index from `id` (left empty when id.nodes is empty). REQUIRES:
// id.group_size >= 1 and id.rank in [0, group_size) (CheckCallId).
// INVALID_ARGUMENT naming the field and values for: more nodes than the
// static cluster has, a duplicate address, group_size not a multiple of
// nodes_size, more ranks per node than this daemon's device slots,
// node_index out of range, nodes[node_index] not this daemon's own --peers
// entry, rank / rpn != node_index. FAILED_PRECONDITION naming it for an
// address that is not in --peers (or a daemon with no --peers).
absl::Status ResolveCallNodes(const hsap::v1::CallId& id, const ValidationLimits& limits,
                              AttentionCall* call);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_CALL_NODES_H_

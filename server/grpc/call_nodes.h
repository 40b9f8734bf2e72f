// The member nodes a call declares (hsap.v1.CallId.nodes / node_index),
// checked at the entry point against this daemon's advertised address and
// device slots.
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

// Fills call->member_addresses and node_index from `id` (left empty when
// id.nodes is empty). REQUIRES: id.group_size >= 1 and id.rank in
// [0, group_size) (CheckCallId). INVALID_ARGUMENT naming the field and
// values for: more than cluster::kMaxGroupNodes nodes, an address that is
// not <host>:<port> (cluster::ValidateNodeAddress), a duplicate address,
// group_size not a multiple of nodes_size, more ranks per node than this
// daemon's device slots, node_index out of range, nodes[node_index] not
// this daemon's advertised address (both named), rank / rpn != node_index.
// FAILED_PRECONDITION for a daemon without TCP (nothing to advertise).
// The other addresses need not be in --peers: their daemons are run-time
// peers (the group forms at its first call).
absl::Status ResolveCallNodes(const hsap::v1::CallId& id, const ValidationLimits& limits,
                              AttentionCall* call);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_CALL_NODES_H_

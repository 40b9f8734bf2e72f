// Test helper: one sequence-parallel group of trainer ranks, each its own
// client of the daemon that serves it, running forward + backward on a
// global problem laid out by Plans.Dispatch, and the results reassembled in
// global token order for comparison with the float64 reference.
#ifndef HSAP_TESTS_INTEGRATION_GROUP_CALL_H_
#define HSAP_TESTS_INTEGRATION_GROUP_CALL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hsap/v1/common.pb.h"

namespace hsap::testing {

struct GlobalProblem {
  std::vector<int64_t> cu_seqlens;
  bool causal = true;
  int64_t heads_q = 4, heads_kv = 2, head_dim = 32;
  // fp32 inputs [T, H, D]
  std::vector<float> q, k, v, d_o;
  // float64 reference outputs
  std::vector<double> o, lse, dq, dk, dv;
  int64_t tokens() const { return cu_seqlens.back(); }
};

// Random inputs and (unless with_reference is false) the reference.
GlobalProblem MakeProblem(std::vector<int64_t> cu_seqlens, bool causal, uint64_t seed,
                          bool with_reference = true, int64_t heads_q = 4, int64_t heads_kv = 2,
                          int64_t head_dim = 32);

struct GroupResult {
  std::vector<double> o, lse, dq, dk, dv;  // global order
  std::vector<hsap::v1::Strategy> strategies_run;
  std::vector<uint64_t> bytes_sent;      // forward, per rank (the transport's count)
  std::vector<uint64_t> bytes_received;  // forward, per rank
  std::vector<uint64_t> bwd_bytes_received;  // backward, per rank
  std::string plan_key;
  // Wall time of the collective calls: from the first rank's request to the
  // last rank's reply.
  double forward_seconds = 0;
  double backward_seconds = 0;
  // The first rank's forward request and the last rank's backward reply.
  absl::Time calls_begin, calls_end;
  double max_error = 0;              // over O, LSE, dQ, dK, dV vs the reference
};

struct GroupSpec {
  std::string group;
  // The group's topology: `nodes` x `devices_per_node` ranks.
  int32_t nodes = 1;
  int32_t devices_per_node = 1;
  // sockets[n]: the gRPC socket of the daemon of the group's node n; rank r
  // uses node r / devices_per_node.
  std::vector<std::string> sockets;
  // When set (one per group node), the calls declare their member nodes:
  // CallId.nodes = member_addresses (the daemons' --peers entries, e.g.
  // "127.0.0.1:<port>", of the same daemons as `sockets`) and
  // node_index = r / devices_per_node. Empty: the old rule (one node, or
  // the whole static cluster).
  std::vector<std::string> member_addresses;
  // When set, edits each rank's CallId before its calls (fault tests).
  std::function<void(int32_t rank, hsap::v1::CallId* id)> edit_call_id;
  hsap::v1::Strategy strategy = hsap::v1::STRATEGY_AUTO;
  hsap::v1::AssignmentPolicy assignment = hsap::v1::ASSIGNMENT_BALANCED;
  uint32_t deadline_ms = 0;
  uint64_t first_call_seq = 1;
  // A rank that connects but never calls (fault tests); -1 = none.
  int32_t missing_rank = -1;
  // When set, receives every calling rank's status (in rank order).
  std::vector<absl::Status>* statuses = nullptr;
  // When set, receives every calling rank's time from its forward request
  // to its last reply (the failing one, if it failed), in rank order.
  std::vector<absl::Duration>* durations = nullptr;
  // When set, called once every rank's calls succeeded, before the ranks'
  // sessions close (so the group is still live in the daemons).
  std::function<void()> while_open;
};

// Runs forward (call_seq first) and backward (first + 1). The status is the
// first failing rank's.
absl::StatusOr<GroupResult> RunGroup(const GlobalProblem& p, const GroupSpec& spec);

// Relative error, absolute where the reference is identically zero.
double RelError(const std::vector<double>& actual, const std::vector<double>& expected);

}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_GROUP_CALL_H_

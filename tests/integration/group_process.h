// Test helper: runs one group (RunGroup) in a child process, so that the
// group's ranks are client sessions of a process of their own, not threads
// of the test process (what a job's trainers are). The child is the test
// binary itself, started with --gtest_filter=<child_test> and
// kGroupChildSpecEnv naming a spec file; that test calls RunGroupChild(),
// which runs the group and writes its outcome to a result file the parent
// reads. The child's output goes to a log whose tail the parent reports if
// the child fails.
#ifndef HSAP_TESTS_INTEGRATION_GROUP_PROCESS_H_
#define HSAP_TESTS_INTEGRATION_GROUP_PROCESS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/integration/group_call.h"

namespace hsap::testing {

inline constexpr char kGroupChildSpecEnv[] = "HSAP_TEST_GROUP_CHILD_SPEC";

// What RunGroup returned in the child.
struct ChildGroupResult {
  absl::Status status;                // RunGroup's (the first failing rank's)
  std::vector<absl::Status> callers;  // every calling rank's, in rank order
  double max_error = 0;
  std::vector<hsap::v1::Strategy> strategies_run;
  std::vector<uint64_t> bytes_received;  // forward, per rank
};

// Runs RunGroup(MakeProblem(cu_seqlens, causal, seed), spec) in a child
// process (spec's group, nodes, devices_per_node, sockets,
// member_addresses, strategy, deadline_ms and missing_rank travel; hooks
// such as edit_call_id do not). `child_test` is the gtest name of the test
// that calls RunGroupChild(). The outer status is the harness's: the child
// could not start, crashed, or outlived `limit` (then it is killed).
absl::StatusOr<ChildGroupResult> RunGroupInChild(const std::vector<int64_t>& cu_seqlens,
                                                 bool causal, uint64_t seed,
                                                 const GroupSpec& spec,
                                                 const std::string& child_test,
                                                 absl::Duration limit);

// In a child started by RunGroupInChild: runs the group its spec names and
// writes the result file; returns OK. FAILED_PRECONDITION when this process
// is not such a child (kGroupChildSpecEnv unset); another error when the
// spec cannot be read or the result written.
absl::Status RunGroupChild();

}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_GROUP_PROCESS_H_

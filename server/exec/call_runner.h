// Runs one rank's validated attention call end to end: the group's topology,
// the plan (cache or compile, checked against the rank's tensors), the
// collective arrival of the group's local ranks (CallMatcher), then the
// executor over the call's transport. One thread per rank, concurrently.
#ifndef HSAP_SERVER_EXEC_CALL_RUNNER_H_
#define HSAP_SERVER_EXEC_CALL_RUNNER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/cpu/thread_pool.h"
#include "server/exec/attention_call.h"
#include "server/exec/call_matcher.h"
#include "server/exec/executor.h"
#include "server/plan/plan_cache.h"

namespace hsap {

struct CallRunnerOptions {
  int32_t num_nodes = 1;
  int32_t devices_per_node = 1;
  int32_t node_rank = 0;
  std::string profile = "cpu-loopback";
  absl::Duration default_deadline = absl::Seconds(60);
};

// What one rank's call did, for its response.
struct CallOutcome {
  std::string plan_key;
  int strategy = 0;  // plan::Strategy that ran (hsap.v1.Strategy number)
  bool plan_cache_hit = false;
  exec::ExecStats exec;
  double wait_seconds = 0;  // until the group was complete
};

// The matcher's per-call resources for a call served by one daemon: the
// in-process fabric of its ranks.
CallMatcher::ResourceFactory InProcessResources(int32_t devices_per_node);

// REQUIRES: `call` came from the validation. Errors: the plan's
// INVALID_ARGUMENT (naming fields), the matcher's (deadline, disagreement,
// replay), the executor's and transport's (ABORTED, DEADLINE_EXCEEDED).
absl::Status RunCall(const AttentionCall& call, const CallRunnerOptions& options,
                     plan::PlanCache* plans, CallMatcher* matcher,
                     kernels::cpu::ThreadPool* pool, CallOutcome* outcome);

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_CALL_RUNNER_H_

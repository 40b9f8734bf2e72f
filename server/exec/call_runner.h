// Runs one rank's validated attention call end to end (CallRunner::Run): the group's layout
// (LayoutForCall: its member nodes, declared in CallId.nodes or the whole
// cluster, and its nodes x ranks-per-node topology), the plan (cache or
// compile, checked against the rank's tensors), the collective arrival of
// the group's local ranks (CallMatcher; a declared multi-node group's peers
// are resolved by address there, Cluster::AcquireGroup), the group's
// formation at its first call (Cluster::FormGroup), agreement on the plan
// key and the member list with the group's other nodes (multi-node
// groups), then the
// executor over the call's transport: the in-process fabric when the group
// lives on this node, UCX when it spans several. One thread per rank.
//
// Failure: a rank whose run fails aborts its call's transports at once (the
// group's other local ranks stop waiting) and, on a cluster, tells the other
// nodes (Cluster::AbortCall). A lost node aborts the calls in flight whose
// group includes it (ActiveCalls::AbortWithNode, from the cluster's
// node-abort callback), so no rank waits for data that will not come, and
// no other group's call is touched: a group's failure domain is its own
// member nodes.
#ifndef HSAP_SERVER_EXEC_CALL_RUNNER_H_
#define HSAP_SERVER_EXEC_CALL_RUNNER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/cluster.h"
#include "server/exec/attention_call.h"
#include "server/exec/call_matcher.h"
#include "server/exec/device_slots.h"
#include "server/exec/executor.h"
#include "server/exec/measured_profile.h"
#include "server/plan/plan_cache.h"
#include "server/transport/comm_ids.h"
#include "server/transport/ucx_worker.h"

namespace hsap {

struct CallRunnerOptions {
  int32_t num_nodes = 1;
  int32_t devices_per_node = 1;
  int32_t node_rank = 0;
  // DaemonOptions::profile (--profile). "measured" (plan::kMeasuredProfile):
  // a one-node group plans with `measured`'s local profile, a multi-node
  // group with the profile its root settles (Cluster::GroupProfile).
  std::string profile = "cpu-loopback";
  exec::MeasuredProfiles* measured = nullptr;  // required for "measured"
  absl::Duration default_deadline = absl::Seconds(60);
  // Set whenever the daemon has TCP (the peer layer: a static cluster, or
  // groups formed at run time); all three outlive the runner. comm_ids
  // hands out the ids `ucx` receives multi-node calls on (one allocator per
  // worker: ids are unique per receiving worker).
  cluster::Cluster* cluster = nullptr;
  transport::UcxWorker* ucx = nullptr;
  transport::CommIdAllocator* comm_ids = nullptr;
};

// What one rank's call did, for its response.
struct CallOutcome {
  std::string plan_key;
  int strategy = 0;  // plan::Strategy that ran (hsap.v1.Strategy number)
  bool plan_cache_hit = false;
  exec::ExecStats exec;
  int slot = 0;  // the device slot the rank ran on
  double wait_seconds = 0;  // until the group was complete (and agreed)
};

// Calls in flight, so that a lost peer or a peer's AbortCall can end them.
class ActiveCalls {
 public:
  struct Entry;
  // Aborts every call in flight (and none started later) with `reason`.
  void AbortAll(const absl::Status& reason);
  // Aborts the calls in flight whose group has a rank on node `node` (and
  // none started later); returns how many.
  int AbortWithNode(int32_t node, const absl::Status& reason);
  // Aborts one call, if it is in flight.
  void Abort(const std::string& group, uint64_t call_seq, const absl::Status& reason);

 private:
  friend class ActiveCallScope;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<GroupResources>> calls_ ABSL_GUARDED_BY(mu_);
};

// The matcher's per-call resources: the transport endpoints of the call's
// local ranks (in-process fabric, or UCX endpoints on a cluster).
CallMatcher::ResourceFactory CallResources(const CallRunnerOptions& options);

// Runs validated calls on this node: what the Attention service needs of
// the daemon. Every pointer must outlive it. Thread-safe (one call per
// rank thread).
class CallRunner {
 public:
  CallRunner(CallRunnerOptions options, plan::PlanCache* plans, CallMatcher* matcher,
             ActiveCalls* active, exec::DeviceSlots* slots)
      : options_(std::move(options)),
        plans_(plans),
        matcher_(matcher),
        active_(active),
        slots_(slots) {}

  // REQUIRES: `call` came from the validation. Errors: the plan's
  // INVALID_ARGUMENT (naming fields), the matcher's (deadline, disagreement,
  // replay), the cluster's (agreement, lost peer), the executor's and
  // transport's (ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED).
  absl::Status Run(const AttentionCall& call, CallOutcome* outcome);

  const CallRunnerOptions& options() const { return options_; }
  exec::DeviceSlots* slots() const { return slots_; }

 private:
  const CallRunnerOptions options_;
  plan::PlanCache* const plans_;
  CallMatcher* const matcher_;
  ActiveCalls* const active_;
  exec::DeviceSlots* const slots_;
};

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_CALL_RUNNER_H_

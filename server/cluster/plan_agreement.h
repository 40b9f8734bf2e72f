// PlanAgreement: the table behind the AgreePlan RPC (DESIGN.md §7). Before
// data moves for a call, every node states the plan key it will run for
// (group, call_seq, direction) and the UCX communicator id it receives the
// call on (comm_ids.h); a node answers a peer's statement with "agreed"
// (and its own id), "mismatch: here is mine", or "not seen yet" (it checks
// the peer's key when its own ranks arrive). Plain data and comparisons, no
// I/O: the Cluster drives the RPCs. Thread-safe.
//
// A call's entry outlives the call (EndLocal), so a peer that asks late
// still gets the answer. A group name can come back after its group was
// released, restarting at call_seq 1: an ended entry that a peer states a
// different receive id for than it stated before is from the old group,
// and is forgotten (answered "not seen yet") rather than handing out the
// old group's receive id.
#ifndef HSAP_SERVER_CLUSTER_PLAN_AGREEMENT_H_
#define HSAP_SERVER_CLUSTER_PLAN_AGREEMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace hsap::cluster {

struct CallKey {
  std::string group;
  uint64_t call_seq = 0;
  bool backward = false;
  bool operator<(const CallKey& o) const {
    return std::tie(group, call_seq, backward) < std::tie(o.group, o.call_seq, o.backward);
  }
};

class PlanAgreement {
 public:
  // Bounds the table: the oldest calls are forgotten beyond this many.
  explicit PlanAgreement(size_t max_calls = 4096) : max_calls_(max_calls) {}

  // Records this node's key and receive comm id for `call` (every local
  // rank of the call states the same). FAILED_PRECONDITION naming both keys
  // and the node when a peer already stated a different one.
  absl::Status SetLocal(const CallKey& call, const std::string& key, uint32_t recv_comm = 0);

  // This node's ranks are done with `call` (both directions of group /
  // call_seq): its entry stays to answer late peers, but is forgotten when
  // a peer shows it is from an older group of the same name (file comment).
  void EndLocal(const std::string& group, uint64_t call_seq);

  // A peer `node` states `key` and `recv_comm` for `call` (the RPC handler).
  // Returns this node's key: equal (agreed), different (mismatch), or empty
  // when this node has not seen the call yet (the peer's key is kept and
  // checked by SetLocal). `local_comm`, if not null, gets this node's
  // receive comm id when the key is not empty.
  std::string OnRemote(const CallKey& call, int32_t node, const std::string& key,
                       uint32_t recv_comm = 0, uint32_t* local_comm = nullptr);

  // True while this node's ranks run group/call_seq as a multi-node call
  // (SetLocal ran for a direction, EndLocal not yet): what a peer's abort
  // may end. A one-node call never states a key, so no peer aborts it.
  bool HasLocal(const std::string& group, uint64_t call_seq);

 private:
  struct Statement {
    std::string key;
    uint32_t recv_comm = 0;
  };
  struct Entry {
    std::string local;  // empty until SetLocal
    uint32_t local_comm = 0;
    bool ended = false;                 // EndLocal ran since SetLocal
    std::map<int32_t, Statement> seen;  // what peers stated
    uint64_t order = 0;
  };
  Entry& FindOrAdd(const CallKey& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_calls_;
  absl::Mutex mu_;
  std::map<CallKey, Entry> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_PLAN_AGREEMENT_H_

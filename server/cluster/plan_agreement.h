// PlanAgreement: the table behind the AgreePlan RPC (DESIGN.md §7). Before
// data moves for a call, every node states the plan key it will run for
// (group, call_seq, direction); a node answers a peer's statement with
// "agreed", "mismatch: here is mine", or "not seen yet" (it checks the
// peer's key when its own ranks arrive). Plain data and comparisons, no
// I/O: the Cluster drives the RPCs. Thread-safe.
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

  // Records this node's key for `call`. FAILED_PRECONDITION naming both keys
  // and the node when a peer already stated a different one.
  absl::Status SetLocal(const CallKey& call, const std::string& key);

  // A peer `node` states `key` for `call` (the RPC handler). Returns this
  // node's key: equal (agreed), different (mismatch), or empty when this
  // node has not seen the call yet (the peer's key is kept and checked by
  // SetLocal).
  std::string OnRemote(const CallKey& call, int32_t node, const std::string& key);

 private:
  struct Entry {
    std::string local;                   // empty until SetLocal
    std::map<int32_t, std::string> seen;  // keys peers stated
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

// The call matcher: calls are collectives (DESIGN.md §7). Every local rank
// of a group submits call_seq k, in its own gRPC thread; Arrive() returns to
// all of them together once the last one has arrived, or fails all of them
// with the same status — never leaves one waiting:
//  * DEADLINE_EXCEEDED when a rank does not arrive by the call's deadline,
//    naming the missing ranks;
//  * INVALID_ARGUMENT when ranks disagree on the call (group size, the
//    member nodes they declared, or the key of the plan they would run:
//    mask, shapes, options);
//  * FAILED_PRECONDITION when a rank replays or skips a call_seq (each
//    rank's calls of a group are numbered k, k + 1, ...);
//  * the abort status after Abort() (draining, a lost peer);
//  * RESOURCE_EXHAUSTED naming --max_call_groups when the table of groups
//    is full.
// A rank that arrives after its call already failed gets that failure at once.
//
// Group state (its size, each rank's last call_seq) is scoped to the
// sessions that took part in it: OnSessionClosed(s) forgets the ranks
// session s submitted (so a stray session that submitted another job's
// rank cannot lock that rank out once it has gone) and releases the group
// once every session that took part has closed and no rank waits in it.
// A group nobody used for CallMatcherLimits::idle_timeout is released too
// (arrivals without a session, session 0, are released only that way).
// A released group starts afresh: any group size, any first call_seq.
//
// Thread-safe.
#ifndef HSAP_SERVER_EXEC_CALL_MATCHER_H_
#define HSAP_SERVER_EXEC_CALL_MATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace hsap {

// Per-call state that the layer above creates once all local ranks have
// arrived (for example the in-process transport fabric of the call's local
// ranks). A fresh one per call, so a failed call leaves nothing poisoned.
struct GroupResources {
  virtual ~GroupResources() = default;
};

struct CallArrival {
  // The client session of the rank (SessionManager's id); 0 = unknown.
  uint64_t session = 0;
  std::string group;
  int32_t group_size = 1;
  int32_t rank = 0;
  uint64_t call_seq = 0;
  // Ranks of the group served by this daemon (all of them on one node).
  std::vector<int32_t> local_ranks;
  // Everything the ranks must agree on, e.g. the plan key in hex.
  std::string agreement_key;
  // The member nodes the rank declared (CallId.nodes, addresses in group
  // node order; empty when it declared none): local ranks that differ fail
  // INVALID_ARGUMENT naming both lists.
  std::vector<std::string> members;
  // The static cluster indices of the group's nodes, in group node order
  // (for the resource factory), when it declared no `members` (the old
  // rule) or one node.
  std::vector<int32_t> member_nodes;
  // When set, polled while the rank waits for its group (every
  // kCancelPoll): true means this rank's client gave up (a cancelled gRPC
  // call). The call then fails CANCELLED for every rank, like a deadline,
  // so the waiting ranks' regions are released at once.
  std::function<bool()> cancelled;
};

inline constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

// What the ranks of one matched call share.
struct MatchedCall {
  std::string group;
  uint64_t call_seq = 0;
  std::shared_ptr<GroupResources> resources;
};

// The defaults are hsapd's flag defaults (server/main.cc).
struct CallMatcherLimits {
  int max_groups = 4096;                                // --max_call_groups
  absl::Duration idle_timeout = absl::Minutes(10);      // --call_group_idle_s
  // Called with the flag name when a cap refuses an arrival.
  std::function<void(const char* flag)> on_refusal;
  // Called with a group's name when it is released (under the matcher's
  // lock: it must not call back into the matcher, nor block).
  std::function<void(const std::string& group)> on_release;
};

class CallMatcher {
 public:
  using ResourceFactory = std::function<std::shared_ptr<GroupResources>(const CallArrival& last)>;

  // `factory` (may be null) makes each matched call's resources, from the
  // arrival of the rank that completed the call (the ranks agree on
  // everything but rank, session and cancelled).
  explicit CallMatcher(ResourceFactory factory = nullptr) : factory_(std::move(factory)) {}
  CallMatcher(const CallMatcher&) = delete;
  CallMatcher& operator=(const CallMatcher&) = delete;

  // See the file comment. REQUIRES: arrival.rank is one of local_ranks.
  absl::StatusOr<std::shared_ptr<const MatchedCall>> Arrive(const CallArrival& arrival,
                                                            absl::Time deadline);

  // Fails every call waiting now, and every later arrival, with `reason`.
  void Abort(const absl::Status& reason);

  // Replaces the limits. REQUIRES: before the first Arrive.
  void SetLimits(CallMatcherLimits limits);

  // Session `session` closed: see the file comment. Thread-safe, O(the
  // session's groups).
  void OnSessionClosed(uint64_t session);

  // Groups known (hsap_call_groups, status pages and tests).
  int num_groups() const;

 private:
  struct PendingCall {
    int32_t expected = 0;
    std::vector<int32_t> arrived;
    std::string agreement_key;
    std::vector<std::string> members;
    int32_t first_rank = 0;
    absl::Status failure;  // set when the call failed for everyone
    std::shared_ptr<MatchedCall> matched;  // set when complete
    int32_t waiting = 0;   // ranks inside Arrive for this call
  };
  struct RankState {
    uint64_t last_seq = 0;
    uint64_t session = 0;  // who submitted it
  };
  struct GroupState {
    int32_t group_size = 0;
    absl::flat_hash_map<int32_t, RankState> ranks;
    // node_hash_map: waiting ranks hold references to their PendingCall
    // while other ranks insert later calls.
    absl::node_hash_map<uint64_t, PendingCall> calls;
    absl::flat_hash_set<uint64_t> sessions;  // live sessions that took part
    bool anonymous = false;                  // an arrival without a session
    absl::Time last_used;
  };

  absl::StatusOr<GroupState*> FindOrAddGroup(const CallArrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases groups idle for idle_timeout; at most once a second unless
  // `force`.
  void SweepIdle(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases `name` if nothing keeps it: no live session (and no anonymous
  // arrival) or idle, and no rank waiting in it.
  void MaybeRelease(const std::string& name, bool idle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool AnyoneWaiting(const GroupState& g);

  const ResourceFactory factory_;
  CallMatcherLimits limits_;
  mutable absl::Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  absl::node_hash_map<std::string, GroupState> groups_ ABSL_GUARDED_BY(mu_);  // stable refs
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<std::string>> groups_of_session_
      ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_CALL_MATCHER_H_

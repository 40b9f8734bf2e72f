// GroupTable: the multi-node groups this daemon's ranks take part in, by
// name (what CallMatcher keys its groups by), each with its member nodes
// (addresses and local peer ids, in group node order) and its formation
// state:
//   FORMING  created at the group's first matched call here; the members
//            join the root (nodes[0]) with Peer.JoinGroup;
//   UP       every member's incarnation and UCX address is known and
//            connected (a group of --peers nodes only is UP at once: the
//            static cluster formed it);
//   FAILED   formation failed, or a member went DOWN or restarted; the
//            group's later calls fail FAILED_PRECONDITION asking for a new
//            group name (a group keeps the incarnations it formed with).
// An entry goes when the call matcher releases the group (its sessions
// closed, or idle). Plain data, not thread-safe: the Cluster guards it.
#ifndef HSAP_SERVER_CLUSTER_GROUP_TABLE_H_
#define HSAP_SERVER_CLUSTER_GROUP_TABLE_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsap::cluster {

enum class GroupState { kForming = 0, kUp = 1, kFailed = 2 };
const char* GroupStateName(GroupState state);

struct GroupMember {
  std::string address;
  int32_t peer = -1;  // PeerTable id
  uint64_t incarnation = 0;  // known once it joined (or formed)
  std::string ucx_address;
  bool joined = false;
  // The root's side of the member's confirmation (Peer.ConfirmMember): the
  // nonce delivered to the member's address (drawn once per slot), a call
  // back in flight, and why the last one failed (for the timeout's message).
  std::string nonce;
  bool confirming = false;
  std::string last_error;
};

struct GroupEntry {
  std::string name;
  std::vector<GroupMember> members;  // group node order
  int32_t node_index = 0;            // this node's place
  uint64_t uid = 0;                  // assigned by the root
  // 16 random bytes drawn by the root, handed to the members that proved
  // their address (JoinGroupResponse.group_key); the members' per-call
  // requests carry it. Empty for a group of static peers only.
  std::string key;
  // A member's side: the nonce the root's ConfirmMember delivered, sent
  // back in the next JoinGroup.
  std::string join_nonce;
  GroupState state = GroupState::kForming;
  absl::Status failure;  // why, when FAILED
  bool forming = false;  // a local rank thread drives the formation
  // Ranks on each member node (group size / nodes) and the matched calls
  // this node ran with it (Cluster::AcquireGroup), for operators.
  int32_t ranks_per_node = 0;
  uint64_t calls = 0;
  // Measured profiles its plans use, by (dtype, head dim) (Cluster::GroupProfile).
  std::map<std::pair<int, int32_t>, std::string> profiles;

  std::vector<int32_t> peers() const;
  bool HasPeer(int32_t peer) const;
  // The member (not this node) with peer id `peer`, or null.
  const GroupMember* MemberOfPeer(int32_t peer) const;
  // The place of `address` among the members, or -1.
  int32_t IndexOf(const std::string& address) const;
  std::vector<std::string> addresses() const;
  // Members other than this node that have not joined (addresses).
  std::vector<std::string> Missing() const;
};

class GroupTable {
 public:
  // At most `max_groups` entries (hsapd --max_call_groups).
  explicit GroupTable(int max_groups = 4096) : max_groups_(max_groups) {}

  // The entry of `name`; `*added` says whether it was created now (FORMING,
  // members' peer ids still -1: the caller fills them).
  // INVALID_ARGUMENT naming both lists when it exists with other members or
  // another node_index; FAILED_PRECONDITION (asking for a new group name)
  // when it FAILED; RESOURCE_EXHAUSTED naming --max_call_groups when full.
  absl::StatusOr<std::shared_ptr<GroupEntry>> FindOrAdd(const std::string& name,
                                                        const std::vector<std::string>& addresses,
                                                        int32_t node_index, bool* added);
  std::shared_ptr<GroupEntry> Find(const std::string& name) const;
  // Removes and returns the entry (null when absent).
  std::shared_ptr<GroupEntry> Remove(const std::string& name);
  // Marks FAILED (with `reason`) every group not already FAILED that has
  // `peer` as a member (other than this node) known with incarnation
  // `incarnation` (0: any); returns how many.
  int FailWithPeer(int32_t peer, uint64_t incarnation, const absl::Status& reason);

  // Entries by state (FORMING, UP, FAILED).
  std::array<int, 3> CountByState() const;
  std::vector<std::shared_ptr<GroupEntry>> All() const;
  int size() const { return static_cast<int>(groups_.size()); }

 private:
  int max_groups_;
  std::map<std::string, std::shared_ptr<GroupEntry>> groups_;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_GROUP_TABLE_H_

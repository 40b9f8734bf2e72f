// PeerTable: the peers one daemon knows, keyed by their advertised TCP
// address (host:port). Two kinds:
//  * pinned: this node and the static --peers, added once at Start, never
//    released (their ids are their --peers indices);
//  * run-time peers: the other members of this daemon's live groups
//    (server/cluster/group_table.h), added when a local rank's call names
//    them (CallId.nodes), reference-counted by the groups and calls that
//    use them, and released once unreferenced for the linger.
// A peer's id (the UcxWorker endpoint key, the node of ActiveCalls) stays
// with its address. A released peer's record goes, but its UCX endpoint is
// *parked* (kept open under its id, with the incarnation it was connected
// to), and a peer that comes back takes its old id and endpoint again:
// closing one side of a connection breaks the other side's endpoint in
// UCX's TCP transport, and the other node, whose linger has not run out,
// may be reusing that endpoint for a new group at that very moment
// (job_groups_test hit it under load). At most --max_peers endpoints stay
// parked; beyond, the oldest is closed. Plain data, not thread-safe: the
// Cluster guards it with its mutex.
#ifndef HSAP_SERVER_CLUSTER_PEER_TABLE_H_
#define HSAP_SERVER_CLUSTER_PEER_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/cluster/link_probe.h"

namespace hsap::cluster {

enum class NodeState { kJoining, kUp, kSuspect, kDown };
const char* NodeStateName(NodeState state);

// What the daemon knows of one peer.
struct PeerRecord {
  int32_t id = 0;
  std::string address;
  bool pinned = false;
  bool self = false;
  // Null for this node (and in unit tests). Shared: an RPC in flight keeps it.
  std::shared_ptr<v1::Peer::Stub> stub;
  NodeState state = NodeState::kJoining;
  uint64_t incarnation = 0;  // 0 until known (Join, or a group's formation)
  std::string ucx_address;
  uint64_t connected_incarnation = 0;  // incarnation whose UCX address we connected
  absl::Time last_heard = absl::InfinitePast();
  // Static peers: went DOWN or restarted since it last joined (re-forming
  // bumps the epoch), and the Join retry schedule.
  bool lost = false;
  absl::Duration join_backoff = absl::Milliseconds(50);
  absl::Time next_join = absl::InfinitePast();
  // Run-time peers: the groups and calls that use it; since when none does.
  int32_t references = 0;
  absl::Time unreferenced_since = absl::InfinitePast();
  bool heartbeat_in_flight = false;
  // The link to it as this node's probe measured it (link_probe.h), for
  // the incarnation it was measured with (kept while the peer is parked).
  LinkFigures link;
};

// How logs and errors name a peer: "<address>#<incarnation>" (the
// incarnation once known), the same on every daemon, unlike its local id.
std::string PeerName(const PeerRecord& peer);

class PeerTable {
 public:
  // At most `max_peers` run-time peers at once (hsapd --max_peers).
  explicit PeerTable(int32_t max_peers = 1024) : max_peers_(max_peers) {}

  // Adds a pinned peer under the next id and returns it.
  // REQUIRES: `address` is not in the table yet.
  PeerRecord* AddPinned(const std::string& address, bool self);

  // The peer at `address` (added as a run-time peer if absent, with
  // `make_stub(address)` as its stub), with one more reference.
  // RESOURCE_EXHAUSTED naming --max_peers when a new one would exceed it.
  absl::StatusOr<PeerRecord*> Reference(
      const std::string& address,
      const std::function<std::shared_ptr<v1::Peer::Stub>(const std::string&)>& make_stub);
  // One reference fewer to peer `id` (pinned peers and unknown ids are
  // ignored); at 0 it starts lingering from `now`.
  void Unreference(int32_t id, absl::Time now);
  // Removes and returns the run-time peers without a reference since at
  // least `linger` before `now`, parking their endpoints; appends to
  // `close` (when not null) the ids of parked endpoints evicted beyond
  // --max_peers, oldest first, which the caller must disconnect.
  std::vector<std::unique_ptr<PeerRecord>> TakeExpired(absl::Time now, absl::Duration linger,
                                                       std::vector<int32_t>* close = nullptr);
  // Endpoints parked (released peers whose UCX endpoint is kept).
  int32_t parked() const { return static_cast<int32_t>(parked_.size()); }

  PeerRecord* Find(int32_t id) const;
  PeerRecord* FindAddress(absl::string_view address) const;
  // Every peer, in id order.
  std::vector<PeerRecord*> All() const;
  int32_t runtime_peers() const { return runtime_peers_; }
  int32_t max_peers() const { return max_peers_; }

 private:
  // A parked endpoint: the id, and the incarnation and UCX address it is
  // connected to.
  struct Parked {
    int32_t id = 0;
    uint64_t connected_incarnation = 0;
    std::string ucx_address;
    absl::Time since;
    LinkFigures link;
  };
  PeerRecord* Add(const std::string& address, int32_t id = -1);

  int32_t max_peers_;
  std::map<int32_t, std::unique_ptr<PeerRecord>> by_id_;
  absl::flat_hash_map<std::string, int32_t> by_address_;
  absl::flat_hash_map<std::string, Parked> parked_;  // by address
  int32_t next_id_ = 0;
  int32_t runtime_peers_ = 0;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_PEER_TABLE_H_

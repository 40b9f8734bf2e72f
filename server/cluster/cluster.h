// Cluster: the peer layer of one hsapd (DESIGN.md §7) over the hsap.v1.Peer
// gRPC service (proto/hsap/v1/peer.proto): an optional static cluster
// (--peers: join, UCX address exchange, heartbeats, failure detection and
// re-forming), groups formed at run time with the peers their members name
// (JoinGroup to the group's root, UCX connected once per peer incarnation,
// heartbeats while a live group references the peer), plan-key agreement
// and call aborts among a call's member nodes.
//
// Wiring in the daemon (the service must be registered before the TCP gRPC
// server starts; Start after it listens):
//
//   cluster::Cluster cluster;
//   builder.RegisterService(cluster.service());
//   server = builder.BuildAndStart();
//   cluster.AddNodeAbortCallback([&](int32_t peer, const absl::Status& why) {
//     active_calls.AbortWithNode(peer, why);   // its groups' calls end UNAVAILABLE
//   });
//   HSAP_RETURN_IF_ERROR(cluster.Start(options, ucx_worker.get()));
//   ... a multi-node call's first match on this node:
//   HSAP_ASSIGN_OR_RETURN(std::vector<int32_t> peers,
//       cluster.AcquireGroup(group, call_nodes, node_index));   // + ReleaseCallPeers
//   HSAP_RETURN_IF_ERROR(cluster.FormGroup(group, deadline));
//   HSAP_ASSIGN_OR_RETURN(std::vector<uint32_t> recv_comm_of_node,
//       cluster.AgreePlan({group, call_seq, backward}, key, my_recv_comm, deadline, peers));
//   ... the call's UCX sends to group node i carry recv_comm_of_node[i] ...
//   cluster.EndCall(group, call_seq);  // when this node's ranks are done
//   cluster.ReleaseGroup(group);       // when the call matcher releases it
//
// Peers are ids of a PeerTable (peer_table.h): the static --peers are
// pinned with their node index as id (this node included); without --peers
// this node is id 0. Each process start draws a random incarnation.
// Static peers: a thread per peer sends Join until joined, then Heartbeat
// every heartbeat_period. Run-time peers: one thread heartbeats each
// referenced peer (asynchronously) every heartbeat_period. A peer not heard
// from for suspect_after is SUSPECT, for down_after DOWN: the node abort
// callbacks run (UNAVAILABLE naming it), its groups FAIL and its UCX
// endpoint is closed. A new incarnation (a restart) aborts likewise.
//
// Thread-safety: all public methods are thread-safe. Callbacks run on a
// heartbeat thread or a gRPC thread, never under the Cluster's lock; they
// must not block for long.
#ifndef HSAP_SERVER_CLUSTER_CLUSTER_H_
#define HSAP_SERVER_CLUSTER_CLUSTER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/cluster/link_probe.h"
#include "server/cluster/group_table.h"
#include "server/cluster/peer_table.h"
#include "server/cluster/peer_tls.h"
#include "server/cluster/plan_agreement.h"
#include "server/plan/cost_model.h"
#include "server/transport/ucx_worker.h"

namespace hsap::cluster {

struct ClusterOptions {
  // host:port of every node's TCP gRPC endpoint, in node order: the static
  // cluster (pinned peers). Empty: no static cluster; groups form at run
  // time.
  std::vector<std::string> peers;
  int32_t node_rank = 0;
  // This node's advertised address (what CallId.nodes names it by). With
  // peers, must equal peers[node_rank] (empty: taken from there).
  std::string advertise_address;
  // Must agree across the static cluster (checked at Join).
  int32_t devices_per_node = 1;
  std::string version;
  absl::Duration heartbeat_period = absl::Milliseconds(200);
  absl::Duration suspect_after = absl::Milliseconds(600);
  absl::Duration down_after = absl::Seconds(1);
  // Start() waits this long for every static peer to join.
  absl::Duration join_timeout = absl::Seconds(30);
  // Deadline of one Join / Heartbeat / AgreePlan / AbortCall / JoinGroup RPC.
  absl::Duration rpc_timeout = absl::Milliseconds(500);
  // Run-time peers at most (--max_peers), and how long one no live group
  // or call references is kept (--peer_linger_ms) before its heartbeats
  // stop and its UCX endpoint closes.
  int32_t max_peers = 1024;
  absl::Duration peer_linger = absl::Seconds(5);
  // Multi-node groups at most (--max_call_groups).
  int max_groups = 4096;
  // Shared token of the cluster's TCP endpoints (hsapd --token_file).
  // Without TLS: sent as `authorization: Bearer <token>` on every Peer RPC,
  // and required on every Peer RPC received (UNAUTHENTICATED otherwise).
  // With TLS it is the operators' credential only: peers prove themselves
  // with their certificates and never send it. Empty: none.
  std::string token;
  // Mutual TLS between daemons (peer_tls.h): a peer call is believed only
  // for the address its certificate names; this node's calls present its
  // certificate. Null: no TLS.
  std::shared_ptr<const PeerTls> tls;
  // Without TLS and without a token, peer calls are refused
  // (UNAUTHENTICATED) unless this is set (hsapd --insecure_peers): a
  // trusted network, or loopback tests.
  bool insecure_peers = false;
  // A group whose members have not all joined its root this long after its
  // formation began here fails, naming them (hsapd --group_form_timeout_ms;
  // the call's deadline when that comes first).
  absl::Duration group_form_timeout = absl::Seconds(5);
};

// Who sent a peer call, as far as this daemon can tell (Cluster::
// AuthorizePeerCall): with TLS, the verified certificate; otherwise only
// the transport address (the request's claims are then checked by calling
// the claimed address back, and by the group key).
struct PeerCaller {
  bool tls = false;
  CertificateIdentity certificate;  // when tls
  std::string transport;            // grpc::ServerContext::peer()
};

// What the Cluster status service reports per peer.
struct NodeStatus {
  int32_t node_rank = 0;  // the peer id (a static node's index)
  std::string address;
  NodeState state = NodeState::kJoining;
  // Since the last heartbeat or Join heard from it (zero for this node).
  absl::Duration heartbeat_age;
  uint64_t incarnation = 0;  // 0 until it joined
  int32_t references = 0;
  bool pinned = false;
  // This node's probe of the link to it (0: not measured).
  double link_bytes_per_s = 0;
  double link_latency_s = 0;
};

struct GroupStatus {
  std::string name;
  GroupState state = GroupState::kForming;
  uint64_t uid = 0;
  std::vector<std::string> nodes;
  int32_t ranks_per_node = 0;
  uint64_t calls = 0;  // matched calls this node ran with it
  // Its settled measured profiles, "<dtype>/d<head dim> custom:...".
  std::vector<std::string> profiles;
};

class PeerServiceImpl;

class Cluster {
 public:
  using NodeAbortCallback = std::function<void(int32_t node, const absl::Status& reason)>;
  using CallAbortCallback =
      std::function<void(const std::string& group, uint64_t call_seq, const absl::Status& reason)>;

  Cluster();
  // Stops the heartbeat threads. REQUIRES: the gRPC server that serves
  // service() has been shut down (or is shut down before the next call).
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // The hsap.v1.Peer service to register with the daemon's TCP gRPC server.
  // Before Start() it answers UNAVAILABLE.
  grpc::Service* service();

  // With options.peers: joins every static peer (retrying with backoff),
  // exchanges UCX worker addresses and connects `worker`'s endpoints
  // (worker may be null: no UCX data plane), then keeps heartbeating;
  // returns once every node is UP, or DEADLINE_EXCEEDED after join_timeout
  // naming the nodes that did not join (the background threads keep
  // trying). Without: returns at once (groups form at run time).
  // INVALID_ARGUMENT for bad options. REQUIRES: called once; `worker`
  // outlives the Cluster.
  absl::Status Start(const ClusterOptions& options, transport::UcxWorker* worker);
  // Ends a Start() that is waiting for the static peers at once
  // (UNAVAILABLE): a daemon told to stop does not wait out join_timeout
  // for a peer that never answers. Heartbeats go on until destruction.
  void CancelStartWait();

  // Runs when a peer goes DOWN or restarts (new incarnation), with its id.
  void AddNodeAbortCallback(NodeAbortCallback callback);
  // Runs when a peer's AbortCall arrives (and for local AbortCall()).
  void AddCallAbortCallback(CallAbortCallback callback);

  // A matched call of multi-node group `group` that declares `nodes`
  // (validated advertised addresses, group node order) with this node at
  // `node_index`: finds or adds the group's entry (FORMING; UP at once when
  // every member is a static peer), references its peers (dialing only
  // these addresses), and returns their ids in group node order, with one
  // reference each for the call (ReleaseCallPeers gives them back). Errors
  // of GroupTable::FindOrAdd and PeerTable::Reference (--max_peers).
  // `ranks_per_node` (group size / nodes) and the call count are kept for
  // GroupStates.
  absl::StatusOr<std::vector<int32_t>> AcquireGroup(const std::string& group,
                                                    const std::vector<std::string>& nodes,
                                                    int32_t node_index,
                                                    int32_t ranks_per_node = 0);
  void ReleaseCallPeers(const std::vector<int32_t>& peers);
  // Forms `group` (after AcquireGroup) unless it is UP: the root waits for
  // every member's JoinGroup (each confirmed by calling the member back), a
  // member sends JoinGroup to the root until it answers formed; both then
  // connect UCX to each member (once per peer incarnation). Every local
  // rank may call it; one drives, the others wait. It waits at most
  // options.group_form_timeout (or to `deadline`, when sooner). Errors (the
  // group is then FAILED): DEADLINE_EXCEEDED naming the members that did
  // not join (or the root), UNAVAILABLE when the root is down,
  // FAILED_PRECONDITION when the root refused (another member list, another
  // root, a member that refused the group, a failed group) or the group
  // already failed, PERMISSION_DENIED when the root does not count this
  // node among the members.
  absl::Status FormGroup(const std::string& group, absl::Time deadline);
  // The call matcher released `group`: its entry goes, its peers lose a
  // reference.
  void ReleaseGroup(const std::string& group);

  // States this node's plan key for `call`, and the UCX communicator id
  // this node receives the call on (recv_comm < 1024, from its
  // CommIdAllocator), and waits until every other node of `members` (the
  // group's peer ids in group node order; empty = every static node in
  // node order) stated the same key. Returns the receive id of each member,
  // in that order (this node's is recv_comm).
  // Errors: `members` does not hold this node or holds an unknown peer
  // (INVALID_ARGUMENT), a member stated another key (FAILED_PRECONDITION
  // naming both), the call was aborted (its status), a member is down or
  // restarted (UNAVAILABLE), a member answered an id >= 1024 (INTERNAL
  // naming it), or the deadline passed (DEADLINE_EXCEEDED naming the
  // members that have not confirmed).
  absl::StatusOr<std::vector<uint32_t>> AgreePlan(const CallKey& call, const std::string& plan_key,
                                                  uint32_t recv_comm, absl::Time deadline,
                                                  const std::vector<int32_t>& members = {});

  // This node's ranks are done with group/call_seq (both directions): its
  // agreement entry stays for peers that ask late (PlanAgreement::EndLocal).
  void EndCall(const std::string& group, uint64_t call_seq);

  // Tells the other nodes of `members` (peer ids; empty = every static
  // peer), best effort with one RPC deadline, and the local callbacks that
  // `group`/`call_seq` failed with `reason`.
  void AbortCall(const std::string& group, uint64_t call_seq, const absl::Status& reason,
                 const std::vector<int32_t>& members = {});

  // The measured cost profile (docs/cost_model.md, "Measured profiles").
  // `local(dtype, head_dim)`: this node's compute rate and intra-node tier
  // (the inter-node figures are the cluster's to fill). Set before Start.
  using LocalProfileFn =
      std::function<absl::StatusOr<plan::HardwareProfile>(DType dtype, int32_t head_dim)>;
  void SetLocalProfile(LocalProfileFn local);
  // The parametric profile ("custom:...") every node of a multi-node group
  // plans its `dtype`/`head_dim` calls with: its root's compute rate and
  // intra tier, and the slowest of the root's measured links to the
  // members (bandwidth: the least; latency: the most), each link probed
  // once per member incarnation (link_probe.h). The root computes it (and
  // keeps it for the group's life: the first answer is the answer); the
  // others ask the root (Peer.GroupProfile) and keep its answer.
  // `declared`: the group named its nodes and was formed (FormGroup);
  // otherwise the whole static cluster, whose root is node 0.
  // Errors: UNAVAILABLE (a probe, or the root, failed), DEADLINE_EXCEEDED,
  // FAILED_PRECONDITION (the group is not known or failed), INVALID_ARGUMENT
  // naming the root when its answer is not a valid parametric profile,
  // RESOURCE_EXHAUSTED beyond kMaxGroupProfiles (dtype, head dim) pairs.
  static constexpr int kMaxGroupProfiles = 64;
  absl::StatusOr<std::string> GroupProfile(const std::string& group, bool declared, DType dtype,
                                           int32_t head_dim, absl::Time deadline);
  // The profile GroupProfile settled on, if it did already (no RPC).
  std::optional<std::string> KnownGroupProfile(const std::string& group, bool declared,
                                               DType dtype, int32_t head_dim) const;
  // The profiles of the static cluster settled so far (for status pages).
  std::vector<std::string> StaticProfiles() const;

  // Every peer this node references (static ones and run-time ones).
  std::vector<NodeStatus> NodeStates() const;
  std::vector<GroupStatus> GroupStates() const;
  // Groups by state (FORMING, UP, FAILED) and run-time peers by state
  // (JOINING, UP, SUSPECT, DOWN): the metrics' gauges.
  std::array<int, 3> GroupCounts() const;
  std::array<int, 4> PeerCounts() const;
  // Every static node UP (and its UCX endpoint connected when there is a
  // worker); true without static peers once started.
  bool formed() const;
  // Incremented each time the static cluster re-forms after losing a node.
  uint64_t epoch() const;
  uint64_t incarnation() const { return incarnation_; }
  int32_t node_rank() const;  // this node's peer id
  std::string self_address() const;

 private:
  friend class PeerServiceImpl;

  // The first step of every Peer handler: with TLS a verified client
  // certificate, else the token when there is one, else --insecure_peers;
  // UNAUTHENTICATED (logged, naming the caller) otherwise. Before Start it
  // lets the call through (the handlers then answer UNAVAILABLE).
  absl::StatusOr<PeerCaller> AuthorizePeerCall(const grpc::ServerContext& context) const;
  // With TLS: PERMISSION_DENIED (logged) unless the caller's certificate
  // names the host of `claimed` (the address the request says it is from).
  // OK without TLS (the claim is checked otherwise).
  absl::Status CheckClaim(const PeerCaller& caller, const std::string& claimed,
                          absl::string_view what) const;
  // RPC handlers (PeerServiceImpl forwards here).
  grpc::Status OnJoin(const PeerCaller& caller, const v1::JoinRequest& request,
                      v1::JoinResponse* response);
  grpc::Status OnHeartbeat(const PeerCaller& caller, const v1::HeartbeatRequest& request,
                           v1::HeartbeatResponse* response);
  grpc::Status OnAgreePlan(const PeerCaller& caller, const v1::AgreePlanRequest& request,
                           v1::AgreePlanResponse* response);
  grpc::Status OnAbortCall(const PeerCaller& caller, const v1::AbortCallRequest& request);
  grpc::Status OnJoinGroup(const PeerCaller& caller, const v1::JoinGroupRequest& request,
                           v1::JoinGroupResponse* response);
  grpc::Status OnConfirmMember(const PeerCaller& caller, const v1::ConfirmMemberRequest& request,
                               v1::ConfirmMemberResponse* response);
  grpc::Status OnGroupProfile(const PeerCaller& caller, const v1::GroupProfileRequest& request,
                              absl::Time deadline, v1::GroupProfileResponse* response);
  // A link probe's answer: OK once started (the payload is only timed by
  // the sender), UNAVAILABLE before Start like every other handler.
  grpc::Status OnProbeLink(const PeerCaller& caller);
  // The root's answer to a JoinGroup from member `index` of `g` (whose
  // identity it has confirmed): formed (with the key when `nonce_ok`) once
  // every member joined. REQUIRES: g is UP or FORMING.
  void AnswerJoinLocked(const GroupEntry& g, bool nonce_ok, v1::JoinGroupResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per-call requests (AgreePlan, AbortCall, GroupProfile) of `group` from
  // `sender` (a peer id, -1 when the address is no peer here) named
  // `sender_name`: OK when it is a member of this node's group of that
  // name with the group's key (or a static peer, for a group this node
  // does not hold: the static cluster's calls), *not_formed when the group
  // is still forming here (the request is then "not seen yet");
  // PERMISSION_DENIED naming the sender and the group otherwise.
  absl::Status CheckCallSenderLocked(absl::string_view what, const std::string& group,
                                     int32_t sender, const std::string& sender_name,
                                     uint64_t incarnation, const std::string& key,
                                     bool* not_formed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A declaration of `group` by this node's ranks that this node refused
  // (or a group that failed here): kept a while so that the group's other
  // nodes learn why at once (JoinGroup to a root that refused, a root's
  // ConfirmMember to a member that refused); a member also tells the root
  // (a JoinGroup with refused_code, sent by the report thread).
  void RecordRefusalLocked(const std::string& group, const std::vector<std::string>& nodes,
                           int32_t node_index, const absl::Status& reason, bool report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReportLoop();
  // The root's side of a member's account (ConfirmMember's answer for
  // member `index` of `g`): joins it when it agrees, fails `g` (returning
  // why) when it refused the group or declared another list; OK without
  // effect when it is not joining yet. `restart` / `member_peer`: a peer
  // restart to run the aborts of (outside mu_).
  absl::Status ApplyMemberViewLocked(GroupEntry& g, int32_t index,
                                     const v1::ConfirmMemberResponse& view, absl::Status* restart,
                                     int32_t* member_peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The root asks the members of forming `g` that have not joined yet.
  void ConfirmMissingMembers(const std::shared_ptr<GroupEntry>& g);
  // Measured profiles (cluster_profiles.cc). The root's computation, and
  // the link to one peer (cached on its record).
  absl::StatusOr<std::string> RootGroupProfile(const std::string& group, bool declared,
                                               DType dtype, int32_t head_dim, absl::Time deadline);
  absl::StatusOr<LinkFigures> PeerLink(int32_t peer, absl::Time deadline);
  // The settled profiles of declared `group` (null when it is not known
  // here), or of the static cluster, by (dtype, head dim).
  using ProfileTable = std::map<std::pair<int, int32_t>, std::string>;
  ProfileTable* ProfilesLocked(const std::string& group, bool declared) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peer id of a per-call request's sender: by `address` (+ its
  // incarnation) when set, else the static node_rank. NOT_FOUND for an
  // address this node does not reference; INVALID_ARGUMENT naming the
  // field for a bad node_rank / group.
  absl::StatusOr<int32_t> SenderPeer(int32_t node_rank, const std::string& address,
                                     uint64_t incarnation, const std::string& group) const;
  // How messages name a per-call request's sender ("<address>#<incarnation>",
  // or a static node), and the address it claims to be (for CheckClaim).
  std::string SenderName(int32_t node_rank, const std::string& address,
                         uint64_t incarnation) const;
  std::string ClaimedAddress(int32_t node_rank, const std::string& address) const;
  // The UCX address check of this node's worker (null without one).
  std::function<absl::Status(absl::string_view)> UcxCheck() const;
  // Records an abort (ours or a peer's) and runs the call-abort callbacks:
  // always for ours (`local`), for a peer's only while this node runs the
  // call as a multi-node call (PlanAgreement::HasLocal).
  void ApplyAbort(const v1::AbortCallRequest& request, const std::string& sender, bool local);
  // The key of declared group `group` here (empty: none, or not known).
  std::string GroupKeyLocked(const std::string& group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void HeartbeatLoop();
  void TickPeer(int32_t node);
  // A static peer told us (Join request or response) its incarnation and
  // UCX address: (re)connect, mark UP, run aborts for a restart.
  void PeerJoined(int32_t node, uint64_t incarnation, const std::string& ucx_address);
  void MarkDown(int32_t node, const absl::Status& reason);
  void RunNodeAbort(int32_t node, const absl::Status& reason);
  v1::JoinRequest MakeJoinRequest() const;
  bool FormedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FormedOrCancelledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PeerRecord& StaticPeer(int32_t node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Run-time peers (cluster_groups.cc).
  // A run-time peer's incarnation and UCX address from a formation: a new
  // incarnation (a restart) fails the groups that knew the old one and
  // returns the abort to run (outside mu_); UCX connects once per
  // incarnation (or when its endpoint failed). Pinned peers are left to
  // the static protocol.
  absl::Status LearnPeerLocked(int32_t peer, uint64_t incarnation, const std::string& ucx_address,
                               absl::Status* restart) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member's side of FormGroup; `by` says which deadline it is, for messages.
  absl::Status JoinRoot(const std::shared_ptr<GroupEntry>& group, absl::Time deadline,
                        const std::string& by);
  void FailGroupLocked(GroupEntry& group, const absl::Status& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct HeartbeatCall;
  void LivenessLoop();
  void LivenessTick(grpc::CompletionQueue* cq, absl::flat_hash_set<HeartbeatCall*>* in_flight);
  void OnRuntimeHeartbeat(int32_t peer, uint64_t incarnation, const grpc::Status& status,
                          uint64_t answered_incarnation);
  std::shared_ptr<v1::Peer::Stub> MakeStub(const std::string& address) const;

  const uint64_t incarnation_;
  std::unique_ptr<PeerServiceImpl> service_;
  PlanAgreement agreement_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool start_wait_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  ClusterOptions options_ ABSL_GUARDED_BY(mu_);
  transport::UcxWorker* worker_ = nullptr;  // set once in Start
  int32_t num_static_ ABSL_GUARDED_BY(mu_) = 0;  // static nodes (ids 0..n-1)
  int32_t self_ ABSL_GUARDED_BY(mu_) = 0;        // this node's peer id
  PeerTable peers_ ABSL_GUARDED_BY(mu_);
  GroupTable groups_ ABSL_GUARDED_BY(mu_);
  uint64_t next_group_uid_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<CallKey, absl::Status> aborted_calls_ ABSL_GUARDED_BY(mu_);
  struct Refusal {
    std::vector<std::string> nodes;
    int32_t node_index = 0;
    absl::Status reason;
    absl::Time when;
  };
  static constexpr size_t kMaxRefusals = 256;
  std::map<std::string, Refusal> refusals_ ABSL_GUARDED_BY(mu_);  // by group name
  std::vector<std::string> reports_ ABSL_GUARDED_BY(mu_);  // groups to report to their root
  LocalProfileFn local_profile_;  // set before Start
  mutable std::map<std::pair<int, int32_t>, std::string> static_profiles_ ABSL_GUARDED_BY(mu_);
  absl::Mutex probe_mu_;  // one link probe at a time (they would share links)

  absl::Mutex callbacks_mu_;
  std::vector<NodeAbortCallback> node_callbacks_ ABSL_GUARDED_BY(callbacks_mu_);
  std::vector<CallAbortCallback> call_callbacks_ ABSL_GUARDED_BY(callbacks_mu_);

  std::thread heartbeat_thread_;
  std::thread liveness_thread_;
  std::thread report_thread_;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_CLUSTER_H_

// Cluster: static membership of the hsapd daemons of one SP cluster
// (DESIGN.md §7) — join, UCX address exchange, heartbeats, failure
// detection and re-forming, plan-key agreement and call aborts — over the
// hsap.v1.Peer gRPC service (proto/hsap/v1/peer.proto).
//
// Wiring in the daemon (the service must be registered before the TCP gRPC
// server starts; Start after it listens):
//
//   cluster::Cluster cluster;
//   builder.RegisterService(cluster.service());
//   server = builder.BuildAndStart();
//   cluster.AddNodeAbortCallback([&](int32_t node, const absl::Status& why) {
//     active_calls.AbortWithNode(node, why);   // its groups' calls end UNAVAILABLE
//   });
//   HSAP_RETURN_IF_ERROR(cluster.Start(options, ucx_worker.get()));
//   ...
//   HSAP_ASSIGN_OR_RETURN(std::vector<uint32_t> recv_comm_of_node,
//       cluster.AgreePlan({group, call_seq, backward}, key, my_recv_comm, deadline,
//                         member_nodes));
//   ... the call's UCX sends to node n carry recv_comm_of_node[n] ...
//   cluster.EndCall(group, call_seq);  // when this node's ranks are done
//
// Membership: options.peers lists every node's host:port in node order
// (this node's own entry included); options.node_rank says which is ours.
// Each process start draws a random incarnation. A background thread sends
// Join to peers it has not joined and Heartbeat to the others every
// heartbeat_period. A peer not heard from for suspect_after is SUSPECT, for
// down_after DOWN: the node abort callbacks run (UNAVAILABLE naming the
// node), and its UCX endpoint is closed. When it answers again (or Joins us,
// or shows a new incarnation — a restart, which also aborts), the UCX
// endpoint is reconnected with the address it sends and the epoch
// increments (re-forming).
//
// Thread-safety: all public methods are thread-safe. Callbacks run on the
// heartbeat thread or a gRPC thread, never under the Cluster's lock; they
// must not block for long.
#ifndef HSAP_SERVER_CLUSTER_CLUSTER_H_
#define HSAP_SERVER_CLUSTER_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "server/cluster/plan_agreement.h"
#include "server/transport/ucx_worker.h"

namespace hsap::cluster {

struct ClusterOptions {
  // host:port of every node's TCP gRPC endpoint, in node order.
  std::vector<std::string> peers;
  int32_t node_rank = 0;
  // Must agree across the cluster (checked at Join).
  int32_t devices_per_node = 1;
  std::string version;
  absl::Duration heartbeat_period = absl::Milliseconds(200);
  absl::Duration suspect_after = absl::Milliseconds(600);
  absl::Duration down_after = absl::Seconds(1);
  // Start() waits this long for every peer to join.
  absl::Duration join_timeout = absl::Seconds(30);
  // Deadline of one Join / Heartbeat / AgreePlan / AbortCall RPC.
  absl::Duration rpc_timeout = absl::Milliseconds(500);
  // Shared token of the cluster's TCP endpoints (hsapd --token_file): sent
  // as `authorization: Bearer <token>` on every Peer RPC, and required on
  // every Peer RPC received (UNAUTHENTICATED otherwise). Empty: none.
  std::string token;
};

enum class NodeState { kJoining, kUp, kSuspect, kDown };
const char* NodeStateName(NodeState state);

// What the Cluster status service reports per node.
struct NodeStatus {
  int32_t node_rank = 0;
  std::string address;
  NodeState state = NodeState::kJoining;
  // Since the last heartbeat or Join heard from it (zero for this node).
  absl::Duration heartbeat_age;
  uint64_t incarnation = 0;  // 0 until it joined
};

class PeerServiceImpl;

class Cluster {
 public:
  using NodeAbortCallback = std::function<void(int32_t node, const absl::Status& reason)>;
  using CallAbortCallback =
      std::function<void(const std::string& group, uint64_t call_seq, const absl::Status& reason)>;

  Cluster();
  // Stops the heartbeat thread. REQUIRES: the gRPC server that serves
  // service() has been shut down (or is shut down before the next call).
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // The hsap.v1.Peer service to register with the daemon's TCP gRPC server.
  // Before Start() it answers UNAVAILABLE.
  grpc::Service* service();

  // Joins every peer (retrying with backoff), exchanges UCX worker
  // addresses and connects `worker`'s endpoints (worker may be null: no UCX
  // data plane), then keeps heartbeating. Returns once every node is UP, or
  // DEADLINE_EXCEEDED after join_timeout naming the nodes that did not join
  // (the background thread keeps trying). INVALID_ARGUMENT for bad options.
  // REQUIRES: called once; `worker` outlives the Cluster.
  absl::Status Start(const ClusterOptions& options, transport::UcxWorker* worker);

  // Runs when a peer goes DOWN or restarts (new incarnation).
  void AddNodeAbortCallback(NodeAbortCallback callback);
  // Runs when a peer's AbortCall arrives (and for local AbortCall()).
  void AddCallAbortCallback(CallAbortCallback callback);

  // States this node's plan key for `call`, and the UCX communicator id
  // this node receives the call on (recv_comm < 1024, from its
  // CommIdAllocator), and waits until every other node of `members` (the
  // group's nodes, by static index; empty = every node of the cluster)
  // stated the same key. Returns the receive id of every node, by static
  // node index (this node's is recv_comm; 0 for nodes outside `members`).
  // Errors: `members` does not hold this node or holds an index outside the
  // cluster (INVALID_ARGUMENT), a member stated another key
  // (FAILED_PRECONDITION naming both), the call was aborted (its status), a
  // member is down or restarted (UNAVAILABLE), a member answered an id >=
  // 1024 (INTERNAL naming it), or the deadline passed (DEADLINE_EXCEEDED
  // naming the members that have not confirmed).
  absl::StatusOr<std::vector<uint32_t>> AgreePlan(const CallKey& call, const std::string& plan_key,
                                                  uint32_t recv_comm, absl::Time deadline,
                                                  const std::vector<int32_t>& members = {});

  // This node's ranks are done with group/call_seq (both directions): its
  // agreement entry stays for peers that ask late (PlanAgreement::EndLocal).
  void EndCall(const std::string& group, uint64_t call_seq);

  // Tells the other nodes of `members` (static indices; empty = every
  // peer), best effort with one RPC deadline, and the local callbacks that
  // `group`/`call_seq` failed with `reason`.
  void AbortCall(const std::string& group, uint64_t call_seq, const absl::Status& reason,
                 const std::vector<int32_t>& members = {});

  std::vector<NodeStatus> NodeStates() const;
  // Every node UP (and its UCX endpoint connected when there is a worker).
  bool formed() const;
  // Incremented each time the cluster re-forms after losing a node.
  uint64_t epoch() const;
  uint64_t incarnation() const { return incarnation_; }
  int32_t node_rank() const;

 private:
  friend class PeerServiceImpl;
  struct Peer;

  // OK when `context` carries options.token (or there is none, or Start
  // has not run: the handlers then answer UNAVAILABLE).
  grpc::Status CheckPeerToken(const grpc::ServerContext& context) const;
  // RPC handlers (PeerServiceImpl forwards here).
  grpc::Status OnJoin(const v1::JoinRequest& request, v1::JoinResponse* response);
  grpc::Status OnHeartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response);
  grpc::Status OnAgreePlan(const v1::AgreePlanRequest& request, v1::AgreePlanResponse* response);
  grpc::Status OnAbortCall(const v1::AbortCallRequest& request);
  // Per-call peer requests: node_rank another member, group non-empty and
  // bounded (peer_validation.h).
  absl::Status ValidateCallRequest(int32_t node_rank, const std::string& group) const;
  // The UCX address check of this node's worker (null without one).
  std::function<absl::Status(absl::string_view)> UcxCheck() const;
  // Records an abort (ours or a peer's) and runs the call-abort callbacks.
  void ApplyAbort(const v1::AbortCallRequest& request);

  void HeartbeatLoop();
  void TickPeer(int32_t node);
  // A peer told us (Join request or response) its incarnation and UCX
  // address: (re)connect, mark UP, run aborts for a restart.
  void PeerJoined(int32_t node, uint64_t incarnation, const std::string& ucx_address);
  void MarkDown(int32_t node, const absl::Status& reason);
  void RunNodeAbort(int32_t node, const absl::Status& reason);
  v1::JoinRequest MakeJoinRequest() const;
  bool FormedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t incarnation_;
  std::unique_ptr<PeerServiceImpl> service_;
  PlanAgreement agreement_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ClusterOptions options_ ABSL_GUARDED_BY(mu_);
  transport::UcxWorker* worker_ = nullptr;  // set once in Start
  std::vector<std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<CallKey, absl::Status> aborted_calls_ ABSL_GUARDED_BY(mu_);

  absl::Mutex callbacks_mu_;
  std::vector<NodeAbortCallback> node_callbacks_ ABSL_GUARDED_BY(callbacks_mu_);
  std::vector<CallAbortCallback> call_callbacks_ ABSL_GUARDED_BY(callbacks_mu_);

  std::thread heartbeat_thread_;
};

}  // namespace hsap::cluster

#endif  // HSAP_SERVER_CLUSTER_CLUSTER_H_

// UcxWorker: one daemon's UCX UCP context and worker (host memory), and its
// endpoints to the daemons of the other nodes. The data-plane transport
// (ucx_transport.h) posts tagged messages through it; the cluster layer
// (server/cluster) publishes Address() to the peers and calls Connect() with
// theirs.
//
//   HSAP_ASSIGN_OR_RETURN(auto worker, UcxWorker::Create({}));
//   publish(worker->Address());                    // over gRPC, a socketpair...
//   HSAP_RETURN_IF_ERROR(worker->Connect(1, address_of_node_1));
//
// Threading: one worker serves every rank thread of the daemon. The UCP
// worker is created UCS_THREAD_MODE_SERIALIZED and every UCP call on it is
// made under mu() — there is no progress thread. Threads that wait for their
// transfers drive progress (the caller-progress model of MPI), and so do
// rank threads between the kernel waves of the work a stage's transfers
// overlap (PendingExchange::Progress, a try-lock): a transfer
// always has a waiting party at both ends, so nothing stalls, and a daemon
// with no call in flight burns no CPU, which matters on nodes whose cores
// run the attention kernels. Whoever progresses completes everybody's
// requests; the others see them complete at their next look.
//
// Failure: endpoints use UCP_ERR_HANDLING_MODE_PEER, so a peer that dies or
// becomes unreachable fails its endpoint (connection reset for tcp,
// keepalive for shared memory) instead of hanging; NodeStatus() then reports
// UNAVAILABLE naming the node until Connect() replaces the endpoint.
#ifndef HSAP_SERVER_TRANSPORT_UCX_WORKER_H_
#define HSAP_SERVER_TRANSPORT_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/transport/ucx_address.h"

namespace hsap::transport {

struct UcxWorkerOptions {
  // UCX transports (UCX_TLS syntax, e.g. "tcp" or "posix,sysv,cma,self").
  // Empty: the environment's UCX_TLS if set, else UCX's own choice among
  // what the machine has (here tcp, self, posix, sysv, cma).
  std::string transports;
  // How often UCX probes an idle endpoint (UCX_KEEPALIVE_INTERVAL); what
  // bounds the detection of a dead peer on transports that have no
  // connection to reset (shared memory). Ignored when the environment sets
  // UCX_KEEPALIVE_INTERVAL.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // UCX_RNDV_THRESH: the message size from which UCX uses its rendezvous
  // protocol. Empty: EagerRndvThresh's rule (eager at every size over TCP,
  // UCX's own threshold otherwise); any other value goes to UCX as given
  // ("auto", "inf", a size). Ignored when the environment sets
  // UCX_RNDV_THRESH.
  std::string rndv_thresh;
};

// The rendezvous threshold the daemon gives UCX when the operator names
// none: "inf" (every message eager) when `transports` (UCX_TLS syntax) names
// tcp and otherwise only same-node transports (self, posix, sysv, cma, sm,
// shm, knem, xpmem); "" (UCX's own threshold) otherwise, and when
// `transports` is empty (UCX's choice, which may be RDMA). Why: over TCP a
// node pair shares one connection, and a rendezvous' handshakes (the
// receiver's ready-to-receive, the sender's completion) queue behind the
// bulk data going the other way on it, so a stage that exchanges with many
// nodes at once idles its links waiting for them (docs/planner.md, "Eager
// transfers over TCP": 4 x 2 emulated allgather 31.2 -> 19.7 s). Eager data
// a receive is not yet posted for waits in UCX's unexpected queue, at most
// what the plan has the peer send (docs/reliability.md).
std::string EagerRndvThresh(absl::string_view transports);

// Whether UCX may use the transport `name` ("posix", "sysv", ...) under the
// list `transports` (UCX_TLS syntax): an empty list, "all", or an exclusion
// list ("^tcp" / "\\tcp") that does not name it allow everything; "sm" and
// "shm" stand for UCX's shared-memory transports (posix, sysv, cma, knem,
// xpmem). The daemon sets a transport's UCX variables only when it is in
// use (hsapd --ucx_transports=tcp sets none, and UCX warns of none unused).
bool TransportInUse(absl::string_view transports, absl::string_view name);

class UcxWorker {
 public:
  // Creates the context (UCP_FEATURE_TAG) and the worker.
  // Errors: the UCX status of the failing call (e.g. UNAVAILABLE or
  // INTERNAL when the transports asked for do not exist), with file:line.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxWorkerOptions& options);

  // Closes every endpoint (forcibly: peers see their endpoint fail), then
  // destroys the worker and the context. REQUIRES: no transport created on
  // this worker is still alive.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // The worker's address (ucp_worker_get_address): opaque bytes to publish
  // to the other nodes. Stable for the worker's life.
  const std::string& Address() const { return address_; }

  // The UCX_RNDV_THRESH this worker set ("" where it left UCX's: the
  // environment named one, or the rule chose UCX's own).
  const std::string& rndv_thresh() const { return rndv_thresh_; }

  // OK iff `address` may be given to UCX (ucx_address.h: the layout of a
  // UCX 1.13 worker address compatible with this worker's); this worker's
  // own address is fine. INVALID_ARGUMENT naming what is wrong. Connect
  // checks it too. Thread-safe.
  absl::Status ValidatePeerAddress(absl::string_view address) const;

  // Creates the endpoint to `node`'s worker at `address` (ValidatePeerAddress
  // first: INVALID_ARGUMENT for bytes UCX must not see) (the node may be
  // this one: same-node ranks also talk through UCX, over self / shared
  // memory). Replaces (force-closes) an existing endpoint to that node: the
  // way to re-form after the peer restarted. Wire-up completes lazily, when
  // both sides progress. Thread-safe.
  // `peer_name` names the peer in errors and logs (the cluster passes
  // "<address>#<incarnation>"); empty: "node <node>".
  absl::Status Connect(int32_t node, absl::string_view address,
                       absl::string_view peer_name = {});

  // Force-closes the endpoint to `node`, if any. Thread-safe.
  void Disconnect(int32_t node);

  // OK when an endpoint to `node` exists and has not failed;
  // FAILED_PRECONDITION when there is none (not connected yet);
  // UNAVAILABLE naming the node and UCX's reason once it failed.
  // Thread-safe.
  absl::Status NodeStatus(int32_t node) const;

  // How many times Connect() has replaced or created the endpoint to `node`
  // (0: never connected). Lets a caller notice a re-formed connection.
  uint64_t ConnectionGeneration(int32_t node) const;

  // --- For the transport (ucx_transport.cc); all REQUIRE mu() held. ---
  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  ucp_worker_h handle() const { return worker_; }
  // The endpoint to `node`, or NodeStatus()'s error.
  absl::StatusOr<ucp_ep_h> EndpointLocked(int32_t node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NodeStatusLocked(int32_t node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Progresses the worker until it reports nothing more to do (bounded);
  // returns how many events were processed.
  unsigned ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 private:
  // One endpoint to one node. Its address is the error handler's argument,
  // so it lives until the endpoint is closed.
  struct Connection {
    UcxWorker* worker = nullptr;
    int32_t node = 0;
    std::string name;  // for errors and logs
    ucp_ep_h ep = nullptr;
    absl::Status error;  // set by the error handler, under mu_ (it runs inside progress)
  };

  UcxWorker() = default;
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Force-closes `connection`'s endpoint and waits (bounded) for the close.
  void CloseLocked(std::unique_ptr<Connection> connection) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::string rndv_thresh_;
  UcxAddressLayout layout_;
  std::map<int32_t, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, uint64_t> generations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::transport

#endif  // HSAP_SERVER_TRANSPORT_UCX_WORKER_H_

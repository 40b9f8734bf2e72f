// Daemon: one hsapd, wired from its options — the session socket, the gRPC
// server on the Unix socket (local clients) and optionally on TCP (peers and
// operators), health and reflection, and graceful drain.
//
//   auto daemon = Daemon::Start(options);   // serving when this returns
//   ...
//   (*daemon)->Drain(absl::Seconds(30));    // NOT_SERVING, finish calls, stop
#ifndef HSAP_SERVER_DAEMON_H_
#define HSAP_SERVER_DAEMON_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "server/daemon_state.h"
#include "server/grpc/plans_service.h"
#include "server/grpc/services.h"
#include "server/cluster/cluster.h"
#include "server/metrics/http_exposer.h"
#include "server/shm/session_socket.h"
#include "server/transport/comm_ids.h"
#include "server/transport/ucx_worker.h"

namespace hsap {

struct DaemonOptions {
  // gRPC Unix socket for local clients; the session socket is this + ".session".
  std::string socket_path = "/run/hsap/hsapd.sock";
  // TCP endpoint for peers and operators; port 0 = off.
  std::string tcp_host = "127.0.0.1";
  int tcp_port = 0;
  // Shared token every TCP call must carry as `authorization: Bearer
  // <token>` (server/grpc/tcp_auth.h); also sent on this node's Peer RPCs.
  // Empty: no token. main.cc reads it from --token_file
  // (common/auth_token.h: ReadTokenFile). With TLS it is the operators'
  // credential only (peers present certificates).
  std::string tcp_token;
  // Mutual TLS between daemons (server/cluster/peer_tls.h): all three PEM
  // files, or none. With them the TCP port speaks TLS only; a peer's
  // identity is its certificate, whose subject alternative names must name
  // the host of the address it advertises.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // Without TLS and without a token the TCP port refuses peer calls unless
  // this is set (a trusted network, loopback tests); the start-up line
  // says which.
  bool insecure_peers = false;
  // A group whose members have not all joined its root this long after its
  // formation began fails, naming them (or at the call's deadline).
  absl::Duration group_form_timeout = absl::Seconds(5);
  // RLIMIT_NOFILE to size the session and peer caps by; 0: getrlimit's
  // soft limit. The caps leave kFdReserve (and a sixteenth) of it to gRPC,
  // health, metrics and the daemon's own files.
  int64_t open_file_limit = 0;
  // CPU device slots ("--devices=cpu:N") and kernel threads (0 = one per core).
  int cpu_devices = 1;
  int cpu_threads = 0;
  // Free CPU kernel scratch blocks kept between calls for the next to reuse
  // (kernels::cpu::SetScratchCacheLimit): saves faulting their pages in
  // again. Process-wide: the last daemon created in a process sets it.
  int64_t kernel_scratch_cache_bytes = int64_t{64} << 20;
  // Emulation only (bench/emulated_cluster): > 0 holds each slot's
  // attention kernels to this rate (exec/paced_backend.h).
  double emulate_flops_per_s = 0;
  // Threads compiling one plan (PlanCacheOptions::compile_threads; used
  // from 64 ranks); 0 = one per core, at most 8.
  int plan_compile_threads = 0;
  // uid allowed on the session socket besides root (default: our own).
  int allowed_uid = -1;
  // Prometheus /metrics over HTTP; port 0 = off.
  std::string metrics_host = "127.0.0.1";
  int metrics_port = 0;
  // The plan viewer on the same port: /plans (the plan cache) and
  // /plans/<key> (a plan's page; server/viewer/plans_http.h).
  bool plan_pages = true;
  // The peer layer is on whenever tcp_port > 0: groups form at run time
  // between the daemons their calls name. peers, optional: a static
  // cluster, every node's TCP host:port in node order (empty or one entry:
  // none) and this node's index.
  std::vector<std::string> peers;
  int node_rank = 0;
  // The address this daemon is named by in CallId.nodes and on the peer
  // service; empty: <tcp_host>:<tcp_port>. With peers it must equal
  // peers[node_rank].
  std::string advertise_address;
  // Run-time peers (other members of this daemon's groups) at most, and how
  // long one no live group uses is kept before it is released.
  int max_peers = 1024;
  absl::Duration peer_linger = absl::Seconds(5);
  // UCX transports for the data plane between nodes (UCX_TLS syntax; empty:
  // UCX's choice).
  std::string ucx_transports;
  // UCX_RNDV_THRESH for the data plane (transport::UcxWorkerOptions::
  // rndv_thresh; empty: eager at every size over TCP, UCX's own otherwise).
  std::string ucx_rndv_thresh;
  absl::Duration heartbeat_period = absl::Milliseconds(200);
  absl::Duration peer_down_after = absl::Seconds(1);
  // Call memory (accumulators, stage buffers) all calls together may
  // reserve; 0: half of the machine's memory (memory_budget.h).
  int64_t memory_budget_bytes = 0;
  // The cost model's hardware profile for plans whose request names none:
  // every Attention call, and Plans requests with an empty profile.
  // "measured" (plan::kMeasuredProfile): what the daemon measures (see
  // hsapd --help and docs/cost_model.md, "Measured profiles").
  std::string profile = "measured";
  // Deadline of a call whose request gives none (CallOptions.deadline_ms 0).
  absl::Duration call_deadline = absl::Seconds(60);
  // Caps (docs/reliability.md). region_limits.max_mappings 0: the default,
  // half of vm.max_map_count (at most SigbusGuard::kSlots), leaving the
  // other half to the daemon's own mappings (threads, heap, buffers).
  shm::RegionLimits region_limits;
  int max_sessions = shm::SessionManager::kDefaultMaxSessions;
  int max_call_groups = 4096;
  // A session connection throttled this long without its client taking an
  // ack is closed (session_socket.h).
  absl::Duration session_stall_timeout = absl::Seconds(30);
  absl::Duration call_group_idle = absl::Minutes(10);
  // The /metrics endpoint's worker threads and per-connection timeout.
  int metrics_threads = 8;
  int metrics_request_timeout_ms = 2000;
};

// The TCP listener's message limit: the largest peer message (a link
// probe carries at most 3 MiB) with room to spare. The Unix socket keeps
// kMaxLocalMessageBytes for local clients' requests.
inline constexpr int kMaxTcpMessageBytes = 4 << 20;
inline constexpr int kMaxLocalMessageBytes = 64 << 20;
// Memory the TCP listener's transport may hold for messages being read, all
// connections together (a gRPC ResourceQuota). The quota is soft in gRPC
// 1.51: past it, gRPC resets streams until it is met again (the sender
// sees RESOURCE_EXHAUSTED, "RST_STREAM with error code 11"), so a refused
// caller's bytes are dropped, though the peak runs above the quota
// (docs/reliability.md, "Trust between daemons").
inline constexpr size_t kTcpMemoryQuotaBytes = 16 << 20;
// File descriptors kept out of the session and peer caps.
inline constexpr int64_t kFdReserve = 64;

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();  // Drain(0) if not drained
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Health -> NOT_SERVING, refuse new calls (UNAVAILABLE), wait up to
  // `timeout` for calls in flight, then stop the servers and end sessions.
  // Idempotent.
  void Drain(absl::Duration timeout);

  DaemonState* state() { return state_.get(); }
  cluster::Cluster* cluster() { return cluster_node_.get(); }
  const std::string& socket_path() const { return options_.socket_path; }
  std::string session_socket_path() const { return options_.socket_path + ".session"; }

 private:
  explicit Daemon(const DaemonOptions& options);
  // Caps, their metrics and refusal counters, the matcher's session hook.
  void WireLimits(const shm::RegionLimits& limits);
  // Start's steps: the gRPC services and server (the bound TCP port), and
  // the background join of the static cluster.
  absl::StatusOr<int> StartServices();
  absl::Status StartCluster();
  void SetServing(bool serving);

  DaemonOptions options_;
  std::unique_ptr<transport::UcxWorker> ucx_;
  std::unique_ptr<transport::CommIdAllocator> comm_ids_;  // the ids ucx_ receives calls on
  std::unique_ptr<cluster::Cluster> cluster_node_;
  std::thread cluster_start_;
  std::unique_ptr<DaemonState> state_;
  std::unique_ptr<AttentionService> attention_;
  std::unique_ptr<RegionsService> regions_;
  std::unique_ptr<ClusterService> cluster_;
  std::unique_ptr<PlansService> plans_;
  std::unique_ptr<grpc::Server> server_;      // the Unix socket
  std::unique_ptr<grpc::Server> tcp_server_;  // the TCP port (peers, operators), if any
  std::shared_ptr<const cluster::PeerTls> tls_;
  std::unique_ptr<shm::SessionSocket> session_socket_;
  class RefreshingCollectable;
  std::unique_ptr<RefreshingCollectable> collect_;  // what exposer_ serves
  std::unique_ptr<metrics::Exposer> exposer_;  // after state_: stops first
  bool drained_ = false;
};

}  // namespace hsap

#endif  // HSAP_SERVER_DAEMON_H_

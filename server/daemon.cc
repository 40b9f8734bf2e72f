#include "server/daemon.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "kernels/cpu/attention.h"
#include "server/cluster/node_address.h"
#include "server/grpc/tcp_gate.h"
#include "server/plan/cost_model.h"
#include "server/viewer/plans_http.h"

namespace hsap {

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

namespace {

// /proc/sys/vm/max_map_count, or 65530 (Linux's default) when unreadable.
int64_t MaxMapCount() {
  int64_t value = 65530;
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    if (std::fscanf(f, "%" SCNd64, &value) != 1) value = 65530;
    std::fclose(f);
  }
  return value;
}

// The caps of `options`, with the mapping cap resolved; INVALID_ARGUMENT
// for values the daemon cannot honour.
absl::StatusOr<shm::RegionLimits> ResolveRegionLimits(const DaemonOptions& options) {
  shm::RegionLimits limits = options.region_limits;
  const int64_t max_map_count = MaxMapCount();
  if (limits.max_mappings == 0) {
    limits.max_mappings = static_cast<uint64_t>(
        std::clamp<int64_t>(max_map_count / 2, 1024, shm::SigbusGuard::kSlots));
  }
  if (limits.max_mappings > static_cast<uint64_t>(shm::SigbusGuard::kSlots) ||
      static_cast<int64_t>(limits.max_mappings) >= max_map_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_region_mappings is ", limits.max_mappings, "; it must stay below vm.max_map_count (",
        max_map_count, ") with headroom, and at most ", shm::SigbusGuard::kSlots));
  }
  if (options.max_sessions < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_sessions is ", options.max_sessions,
                                                   "; it must be >= 1"));
  }
  if (options.session_stall_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_stall_timeout_s is ",
                     absl::ToInt64Seconds(options.session_stall_timeout), "; it must be >= 1"));
  }
  if (options.max_call_groups < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_call_groups is ", options.max_call_groups,
                                                   "; it must be >= 1"));
  }
  if (options.kernel_scratch_cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kernel_scratch_cache_bytes is ",
                                                   options.kernel_scratch_cache_bytes,
                                                   "; it must be >= 0"));
  }
  return limits;
}

// The session and peer caps that fit the open-file limit: kFdReserve plus a
// sixteenth of the limit stay for gRPC's own connections and threads,
// health checks, /metrics and the daemon's files; of the rest, half for
// sessions (2 fds each: the session socket and the client's gRPC
// connection) and half for peers (4 each: a channel to it, its channel to
// us, UCX's TCP endpoints). A flag below that is kept.
struct FdCaps {
  int64_t open_files = 0;
  int sessions = 0;
  int peers = 0;
};
FdCaps ResolveFdCaps(const DaemonOptions& options) {
  FdCaps caps;
  caps.open_files = options.open_file_limit;
  if (caps.open_files <= 0) {
    struct rlimit limit;
    caps.open_files = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                          ? static_cast<int64_t>(limit.rlim_cur)
                          : int64_t{1} << 20;
  }
  const int64_t budget = std::max<int64_t>(caps.open_files - kFdReserve - caps.open_files / 16, 8);
  caps.sessions = static_cast<int>(
      std::clamp<int64_t>(budget / 2 / 2, 1, std::max(options.max_sessions, 1)));
  caps.peers = static_cast<int>(
      std::clamp<int64_t>(budget / 2 / 4, 1, std::max(options.max_peers, 1)));
  return caps;
}

}  // namespace

// The daemon's registry, with the mirrored gauges (peer layer, regions,
// sessions, plan cache) refreshed at each scrape.
class Daemon::RefreshingCollectable final : public metrics::Collectable {
 public:
  explicit RefreshingCollectable(DaemonState* state) : state_(state) {}
  std::vector<metrics::MetricFamily> Collect() const override {
    state_->RefreshGauges();
    return state_->metrics_registry.Collect();
  }

 private:
  DaemonState* const state_;
};

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  if (options.cpu_devices < 1 || options.cpu_devices > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices: cpu:", options.cpu_devices, " must name 1 to 1024 CPU slots"));
  }
  if (options.profile != plan::kMeasuredProfile && !plan::IsKnownProfile(options.profile)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile '", options.profile, "' is not 'measured', one of ",
        absl::StrJoin(plan::HardwareProfileNames(), ", "), " or a valid custom:... profile (",
        plan::ParseHardwareProfile(options.profile).status().message(), ")"));
  }
  DaemonOptions resolved = options;
  const int num_nodes = std::max<int>(1, static_cast<int>(options.peers.size()));
  if (num_nodes > 1) {
    if (options.node_rank < 0 || options.node_rank >= num_nodes) {
      return absl::InvalidArgumentError(absl::StrCat("node_rank is ", options.node_rank,
                                                     " but peers lists ", num_nodes, " nodes"));
    }
    if (options.tcp_port <= 0) {
      return absl::InvalidArgumentError("peers are set but port is 0: peers talk over TCP");
    }
  }
  if (options.tcp_port > 0) {
    if (resolved.advertise_address.empty()) {
      resolved.advertise_address = num_nodes > 1
                                       ? options.peers[options.node_rank]
                                       : absl::StrCat(options.tcp_host, ":", options.tcp_port);
    }
    HSAP_RETURN_IF_ERROR(
        cluster::ValidateNodeAddress("--advertise_address", resolved.advertise_address));
    if (num_nodes > 1 && resolved.advertise_address != options.peers[options.node_rank]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise_address is '", resolved.advertise_address, "' but --peers[", options.node_rank,
          "] (--node_rank) is '", options.peers[options.node_rank], "'; they must be equal"));
    }
    if (options.max_peers < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_peers is ", options.max_peers, "; it must be >= 1"));
    }
  } else if (!options.advertise_address.empty()) {
    return absl::InvalidArgumentError("--advertise_address is set but --port is 0 (no TCP)");
  }
  if (options.group_form_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_form_timeout_ms is ", absl::ToInt64Milliseconds(options.group_form_timeout),
        "; it must be >= 100"));
  }
  // Sessions and peers hold fds: their caps stay below the open-file limit.
  const FdCaps fd_caps = ResolveFdCaps(options);
  if (fd_caps.sessions < options.max_sessions || fd_caps.peers < options.max_peers) {
    HSAP_LOG(WARNING) << "open-file limit " << fd_caps.open_files << ": caps lowered to "
                      << fd_caps.sessions << " sessions (--max_sessions " << options.max_sessions
                      << ") and " << fd_caps.peers << " peers (--max_peers " << options.max_peers
                      << "), keeping " << kFdReserve + fd_caps.open_files / 16
                      << " fds for gRPC, health and metrics; raise RLIMIT_NOFILE (LimitNOFILE= "
                      << "in systemd) for more";
  }
  resolved.max_sessions = fd_caps.sessions;
  resolved.max_peers = fd_caps.peers;
  std::shared_ptr<const cluster::PeerTls> tls;
  const bool tls_asked = !options.tls_cert_file.empty() || !options.tls_key_file.empty() ||
                         !options.tls_ca_file.empty();
  if (tls_asked) {
    if (options.tcp_port <= 0) {
      return absl::InvalidArgumentError("--tls_cert/--tls_key/--tls_ca are set but --port is 0");
    }
    auto loaded = cluster::PeerTls::Load(
        {options.tls_cert_file, options.tls_key_file, options.tls_ca_file});
    if (!loaded.ok()) return loaded.status();
    tls = *std::move(loaded);
    if (!tls->self().NamesHostOf(resolved.advertise_address)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_cert (", tls->self().Describe(), ") does not name '",
          cluster::HostOfAddress(resolved.advertise_address), "', the host of this daemon's "
          "advertised address ", resolved.advertise_address,
          ": its peers would refuse it (add it to the certificate's subject alternative names)"));
    }
  }
  std::unique_ptr<Daemon> d(new Daemon(resolved));
  d->tls_ = tls;
  if (options.tcp_port > 0) {
    // First, before other threads start: UCX reads its environment here.
    transport::UcxWorkerOptions ucx_options;
    ucx_options.transports = options.ucx_transports;
    ucx_options.rndv_thresh = options.ucx_rndv_thresh;
    auto worker = transport::UcxWorker::Create(ucx_options);
    if (!worker.ok()) return worker.status();
    HSAP_LOG(INFO) << "UCX data plane: transports "
                   << (options.ucx_transports.empty() ? "(UCX's choice)" : options.ucx_transports)
                   << ", rendezvous threshold "
                   << ((*worker)->rndv_thresh().empty() ? "UCX's (or UCX_RNDV_THRESH)"
                                                        : (*worker)->rndv_thresh());
    d->ucx_ = std::move(worker).value();
    d->comm_ids_ = std::make_unique<transport::CommIdAllocator>();
    d->cluster_node_ = std::make_unique<cluster::Cluster>();
  }
  int threads = options.cpu_threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  CallRunnerOptions runner;
  runner.num_nodes = num_nodes;
  runner.devices_per_node = options.cpu_devices;
  runner.node_rank = num_nodes > 1 ? options.node_rank : 0;
  runner.default_deadline = options.call_deadline;
  runner.profile = options.profile;
  runner.cluster = d->cluster_node_.get();  // null without TCP
  runner.ucx = d->ucx_.get();
  runner.comm_ids = d->comm_ids_.get();
  std::vector<std::string> devices;
  for (int i = 0; i < options.cpu_devices; ++i) devices.push_back(absl::StrCat("cpu:", i));
  int plan_threads = options.plan_compile_threads;
  if (plan_threads <= 0) plan_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  const int64_t budget = options.memory_budget_bytes > 0 ? options.memory_budget_bytes
                                                         : exec::DefaultMemoryBudgetBytes();
  auto region_limits = ResolveRegionLimits(options);
  if (!region_limits.ok()) return region_limits.status();
  kernels::cpu::SetScratchCacheLimit(static_cast<size_t>(options.kernel_scratch_cache_bytes));
  d->state_ = std::make_unique<DaemonState>(threads, runner, devices, *region_limits,
                                            plan_threads, budget, options.emulate_flops_per_s);
  d->WireLimits(*region_limits);
  if (options.metrics_port > 0) {
    metrics::ExposerOptions m;
    m.bind_address = absl::StrCat(options.metrics_host, ":", options.metrics_port);
    m.num_threads = options.metrics_threads;
    m.request_timeout_ms = options.metrics_request_timeout_ms;
    auto exposer = metrics::Exposer::Create(m);
    if (!exposer.ok()) return exposer.status();
    d->exposer_ = std::move(exposer).value();
    d->collect_ = std::make_unique<RefreshingCollectable>(d->state_.get());
    d->exposer_->RegisterCollectable(d->collect_.get());
    if (options.plan_pages) {
      // Read-only views of the plan cache (Show/List count no hits).
      const plan::PlanCache* plans = &d->state_->plans;
      const std::string origin = absl::StrCat(
          "hsapd ",
          resolved.advertise_address.empty() ? options.socket_path : resolved.advertise_address,
          ", plan cache");
      d->exposer_->AddPages(std::string(viewer::kPlansPath),
                            [plans, origin](const std::string& path) {
                              viewer::HttpAnswer a = viewer::ServePlansPath(*plans, path, origin);
                              return metrics::HttpPage{a.status, std::move(a.content_type),
                                                       std::move(a.body)};
                            });
    }
  }
  d->state_->limits.max_group_size = num_nodes * options.cpu_devices;
  if (num_nodes > 1) {
    d->state_->limits.peers = options.peers;
    d->state_->limits.node_rank = options.node_rank;
  }
  d->state_->limits.self_address = resolved.advertise_address;
  d->state_->cluster = d->cluster_node_.get();
  d->state_->limits.device_slots = options.cpu_devices;
  if (options.tcp_port > 0 && tls == nullptr) {
    // See docs/reliability.md, "Trust between daemons".
    if (options.tcp_token.empty() && options.insecure_peers) {
      HSAP_LOG(WARNING) << "*** TCP port " << options.tcp_port << " takes peer calls WITHOUT "
                        << "authentication (--insecure_peers): anyone who can reach "
                        << options.tcp_host << ":" << options.tcp_port
                        << " can talk to this daemon's peer service. Use --tls_cert/--tls_key/"
                        << "--tls_ca (or at least --token_file) off a trusted network. ***";
    } else if (options.tcp_token.empty()) {
      HSAP_LOG(WARNING) << "TCP port " << options.tcp_port << " has neither TLS nor a token: "
                        << "it refuses every peer call (groups with other daemons cannot form); "
                        << "give --tls_cert/--tls_key/--tls_ca, --token_file, or --insecure_peers";
    } else {
      HSAP_LOG(WARNING) << "TCP port " << options.tcp_port << " authenticates with the token "
                        << "but has no TLS: the token and all peer traffic cross the network in "
                        << "clear text; give --tls_cert/--tls_key/--tls_ca off a private network";
    }
  }
  if (d->cluster_node_ != nullptr) {
    DaemonState* state = d->state_.get();
    // A lost node ends the calls of the groups that include it, and no
    // other group's (a one-node group here never waits for a peer).
    // `why` names the node (its static index or its address).
    d->cluster_node_->AddNodeAbortCallback([state](int32_t node, const absl::Status& why) {
      state->active.AbortWithNode(
          node, absl::Status(why.code(), absl::StrCat("node lost: ", why.message())));
    });
    d->cluster_node_->AddCallAbortCallback(
        [state](const std::string& group, uint64_t call_seq, const absl::Status& why) {
          state->active.Abort(group, call_seq, why);
        });
  }

  absl::StatusOr<int> bound_tcp = d->StartServices();
  if (!bound_tcp.ok()) return bound_tcp.status();
  if (d->cluster_node_ != nullptr) HSAP_RETURN_IF_ERROR(d->StartCluster());
  d->SetServing(true);
  // The session socket last: a client that reaches it (the Python client's
  // LocalDaemon waits for it) finds the gRPC services up and serving.
  const uint32_t uid = options.allowed_uid >= 0 ? options.allowed_uid : getuid();
  auto sessions = shm::SessionSocket::Start(d->session_socket_path(), &d->state_->sessions, uid,
                                            options.session_stall_timeout);
  if (!sessions.ok()) return sessions.status();
  d->session_socket_ = std::move(sessions).value();
  HSAP_LOG(INFO) << "hsapd serving on unix:" << options.socket_path << " (sessions: "
                 << d->session_socket_path() << ")"
                 << (options.tcp_port > 0
                         ? absl::StrCat(", tcp ", options.tcp_host, ":", *bound_tcp, " (",
                                        tls != nullptr ? "mutual TLS"
                                        : !options.tcp_token.empty()
                                            ? "token, no TLS"
                                        : options.insecure_peers
                                            ? "INSECURE peers: --insecure_peers"
                                            : "no TLS, no token: peer calls refused",
                                        !options.tcp_token.empty() && tls != nullptr
                                            ? ", token for operators"
                                            : "",
                                        ")")
                         : std::string(", tcp off"))
                 << "; devices cpu:" << options.cpu_devices << ", " << threads << " kernel threads"
                 << (d->exposer_ != nullptr
                         ? absl::StrCat("; metrics http://", options.metrics_host, ":",
                                        d->exposer_->port(), "/metrics",
                                        options.plan_pages ? ", plans /plans" : "")
                         : std::string());
  return d;
}

// The gRPC services and server; the bound TCP port (0 without TCP).
absl::StatusOr<int> Daemon::StartServices() {
  DaemonState* s = state_.get();
  auto refresh = [s] { s->RefreshGauges(); };
  attention_ = std::make_unique<AttentionService>(
      AttentionDeps{&s->gate, &s->sessions, &s->regions, &s->limits, &s->runner, &s->metrics,
                    refresh, options_.tcp_token});
  regions_ = std::make_unique<RegionsService>(
      RegionsDeps{&s->sessions, &s->regions, refresh, options_.tcp_token});
  cluster_ = std::make_unique<ClusterService>(
      ClusterDeps{&s->gate, &s->sessions, cluster_node_.get(), s->slots.get(), options_.tcp_token,
                  options_.profile, &s->measured});
  plan::SpecDefaults defaults{options_.profile};
  defaults.measured = [s](DType dtype, int32_t head_dim) {
    return s->measured.LocalProfile(dtype, head_dim);
  };
  plans_ = std::make_unique<PlansService>(&state_->plans, options_.tcp_token, defaults, s->limits);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Two servers, so that each listener has its own limits: the Unix socket
  // takes local clients' large requests; the TCP port takes what peers and
  // operators send, in a bounded memory quota (a refused caller cannot make
  // the daemon buffer its body beyond it).
  auto register_services = [this](grpc::ServerBuilder& builder) {
    builder.RegisterService(attention_.get());
    builder.RegisterService(regions_.get());
    builder.RegisterService(cluster_.get());
    builder.RegisterService(plans_.get());
  };
  grpc::ServerBuilder builder;
  unlink(options_.socket_path.c_str());
  builder.AddListeningPort("unix:" + options_.socket_path, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(kMaxLocalMessageBytes);
  register_services(builder);
  const mode_t old_mask = umask(0177);  // the Unix socket is created 0600
  server_ = builder.BuildAndStart();
  umask(old_mask);
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("could not listen on unix:", options_.socket_path));
  }
  chmod(options_.socket_path.c_str(), 0600);
  int bound_tcp = 0;
  if (options_.tcp_port > 0) {
    grpc::ServerBuilder tcp;
    // Calls without the credentials their handler needs are refused at
    // their headers, before their bodies are read (tcp_gate.h).
    TcpGatePolicy gate;
    gate.token = options_.tcp_token;
    gate.tls = tls_ != nullptr;
    gate.insecure_peers = options_.insecure_peers;
    gate.self = options_.advertise_address;
    std::shared_ptr<grpc::ServerCredentials> credentials;
    if (tls_ != nullptr) {
      credentials = tls_->ServerCredentials();
      GateTlsCredentials(*credentials, std::move(gate));
    } else {
      credentials = GatedInsecureCredentials(std::move(gate));
    }
    tcp.AddListeningPort(absl::StrCat(options_.tcp_host, ":", options_.tcp_port), credentials,
                         &bound_tcp);
    tcp.SetMaxReceiveMessageSize(kMaxTcpMessageBytes);
    grpc::ResourceQuota quota("hsapd-tcp");
    quota.Resize(kTcpMemoryQuotaBytes);
    tcp.SetResourceQuota(quota);
    // No BDP probing on this listener. gRPC 1.51's quota is soft: every
    // read is granted, then a reclaimer resets one stream per pass. With
    // BDP probing each connection's window grows as fast as a sender
    // fills it, and 12 senders of 60 MiB messages grew the daemon by
    // 50-130 MiB before their streams were reset; without it, by about
    // half (tests/integration/peer_resource_test.cc). A 3 MiB link probe
    // over loopback takes as long either way (docs/reliability.md).
    tcp.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    register_services(tcp);
    if (cluster_node_ != nullptr) tcp.RegisterService(cluster_node_->service());
    tcp_server_ = tcp.BuildAndStart();
    if (tcp_server_ == nullptr || bound_tcp == 0) {
      return absl::UnavailableError(
          absl::StrCat("could not listen on ", options_.tcp_host, ":", options_.tcp_port));
    }
  }
  return bound_tcp;
}

// Starts the peer layer; joins the static cluster, if any, in the
// background (local calls are served meanwhile).
absl::Status Daemon::StartCluster() {
  cluster::ClusterOptions c;
  c.peers = options_.peers;
  c.node_rank = options_.node_rank;
  c.advertise_address = options_.advertise_address;
  c.max_peers = options_.max_peers;
  c.peer_linger = options_.peer_linger;
  c.max_groups = options_.max_call_groups;
  c.devices_per_node = options_.cpu_devices;
  c.version = kVersion;
  c.token = options_.tcp_token;
  c.tls = tls_;
  c.insecure_peers = options_.insecure_peers;
  c.group_form_timeout = options_.group_form_timeout;
  c.heartbeat_period = options_.heartbeat_period;
  c.suspect_after = options_.peer_down_after * 0.6;
  c.down_after = options_.peer_down_after;
  cluster::Cluster* node = cluster_node_.get();
  transport::UcxWorker* worker = ucx_.get();
  // A group's root plans its groups with its own compute rate and intra
  // tier (the links it measures itself).
  exec::MeasuredProfiles* measured = &state_->measured;
  node->SetLocalProfile(
      [measured](DType dtype, int32_t head_dim) -> absl::StatusOr<plan::HardwareProfile> {
        auto rate = measured->Compute(dtype, head_dim);
        if (!rate.ok()) return rate.status();
        const exec::IntraTier intra = measured->Intra();
        return exec::MeasuredHardwareProfile(*rate, intra, intra.bytes_per_s, intra.latency_s);
      });
  if (c.peers.empty()) {
    // No static cluster: nothing to wait for (groups form at run time).
    return node->Start(c, worker);
  }
  // Joining waits for the other nodes; serve local calls meanwhile.
  cluster_start_ = std::thread([node, worker, c] {
    absl::Status st = node->Start(c, worker);
    if (st.ok()) {
      HSAP_LOG(INFO) << "cluster formed: " << c.peers.size() << " nodes";
    } else {
      HSAP_LOG(WARNING) << "cluster not formed yet: " << st;
    }
  });
  return absl::OkStatus();
}

void Daemon::WireLimits(const shm::RegionLimits& limits) {
  DaemonState* state = state_.get();
  auto refused = [state](const char* flag) { state->metrics.RecordLimitRefusal(flag); };
  state->regions.SetRefusalHook(refused);
  state->sessions.Configure(options_.max_sessions, refused);
  cluster::Cluster* peers = cluster_node_.get();
  state->matcher.SetLimits({.max_groups = options_.max_call_groups,
                            .idle_timeout = options_.call_group_idle,
                            .on_refusal = refused,
                            // A released group's peers lose a reference.
                            .on_release = [peers](const std::string& group) {
                              if (peers != nullptr) peers->ReleaseGroup(group);
                            }});
  // A closed session's groups are released (call_matcher.h).
  state->sessions.AddCloseCallback([state](uint64_t session) {
    state->matcher.OnSessionClosed(session);
    state->RefreshGauges();
  });
  // Every cap is a metric: a name missing from kLimitLabels would be dropped
  // without a word, so it stops the daemon here instead.
  auto& metrics = state->metrics;
  const auto set_limit = [&metrics](absl::string_view limit, double value) {
    HSAP_CHECK(metrics.SetLimit(limit, value)) << limit << " is not in kLimitLabels";
  };
  set_limit("max_sessions", options_.max_sessions);
  set_limit("max_pending_fds_per_session", shm::SessionManager::kMaxPendingFds);
  set_limit("max_regions_per_session", static_cast<double>(limits.max_regions_per_session));
  set_limit("max_regions", static_cast<double>(limits.max_regions));
  set_limit("max_region_bytes_per_session", static_cast<double>(limits.max_bytes_per_session));
  set_limit("max_region_bytes", static_cast<double>(limits.max_total_bytes));
  set_limit("max_region_mappings", static_cast<double>(limits.max_mappings));
  set_limit("max_call_groups", options_.max_call_groups);
  set_limit("max_peers", options_.max_peers);
  set_limit("max_message_bytes", kMaxLocalMessageBytes);
  set_limit("max_tcp_message_bytes", kMaxTcpMessageBytes);
  set_limit("plan_cache_bytes", static_cast<double>(plan::PlanCacheOptions().max_bytes));
  set_limit("kernel_scratch_cache_bytes", static_cast<double>(options_.kernel_scratch_cache_bytes));
  HSAP_LOG(INFO) << "caps: " << options_.max_sessions << " sessions, "
                 << limits.max_regions_per_session << " regions per session, "
                 << limits.max_regions << " regions, " << limits.max_bytes_per_session
                 << " bytes per session, " << limits.max_total_bytes << " bytes, "
                 << limits.max_mappings << " mappings, " << options_.max_call_groups
                 << " call groups";
}

void Daemon::SetServing(bool serving) {
  for (grpc::Server* server : {server_.get(), tcp_server_.get()}) {
    if (server == nullptr) continue;
    auto* health = server->GetHealthCheckService();
    if (health == nullptr) continue;
    health->SetServingStatus(serving);
    for (const char* service :
         {"hsap.v1.Attention", "hsap.v1.Regions", "hsap.v1.Cluster", "hsap.v1.Plans"}) {
      health->SetServingStatus(service, serving);
    }
  }
}

void Daemon::Drain(absl::Duration timeout) {
  if (drained_) return;
  drained_ = true;
  HSAP_LOG(INFO) << "draining: " << state_->gate.in_flight() << " call(s) in flight";
  SetServing(false);
  state_->gate.Close();
  state_->matcher.Abort(absl::UnavailableError("hsapd is draining: the call was not started"));
  if (!state_->gate.WaitIdle(absl::Now() + timeout)) {
    HSAP_LOG(WARNING) << "drain timeout: " << state_->gate.in_flight() << " call(s) cut short";
  }
  state_->active.AbortAll(absl::UnavailableError("hsapd is draining"));
  const auto stop_by = std::chrono::system_clock::now() + std::chrono::seconds(1);
  if (tcp_server_ != nullptr) tcp_server_->Shutdown(stop_by);
  server_->Shutdown(stop_by);
  if (cluster_start_.joinable()) {
    // A static peer that never answered must not hold the stop for the
    // rest of --join_timeout.
    cluster_node_->CancelStartWait();
    cluster_start_.join();
  }
  session_socket_.reset();  // ends every session, reclaims their regions
  exposer_.reset();
  unlink(options_.socket_path.c_str());
  HSAP_LOG(INFO) << "drained";
}

Daemon::~Daemon() {
  if (server_ != nullptr) Drain(absl::ZeroDuration());
}

}  // namespace hsap

#include "server/daemon.h"

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
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/cluster/node_address.h"
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
  return limits;
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
  std::unique_ptr<Daemon> d(new Daemon(resolved));
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
  if (options.tcp_port > 0 && options.tcp_token.empty()) {
    // Kept working for single-machine tests and trusted networks; see
    // docs/decisions.md ("TCP token").
    HSAP_LOG(WARNING) << "*** TCP port " << options.tcp_port << " is open WITHOUT a token: anyone "
                      << "who can reach " << options.tcp_host << ":" << options.tcp_port
                      << " can join this daemon's groups, abort their calls,"
                      << " and evict plans. Give --token_file (mode 0600) on every node. ***";
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
                         ? absl::StrCat(", tcp ", options.tcp_host, ":", *bound_tcp,
                                        options.tcp_token.empty() ? " (no token)" : " (token)")
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
  grpc::ServerBuilder builder;
  unlink(options_.socket_path.c_str());
  builder.AddListeningPort("unix:" + options_.socket_path, grpc::InsecureServerCredentials());
  int bound_tcp = 0;
  if (options_.tcp_port > 0) {
    builder.AddListeningPort(absl::StrCat(options_.tcp_host, ":", options_.tcp_port),
                             grpc::InsecureServerCredentials(), &bound_tcp);
  }
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(attention_.get());
  builder.RegisterService(regions_.get());
  builder.RegisterService(cluster_.get());
  builder.RegisterService(plans_.get());
  if (cluster_node_ != nullptr) builder.RegisterService(cluster_node_->service());
  const mode_t old_mask = umask(0177);  // the Unix socket is created 0600
  server_ = builder.BuildAndStart();
  umask(old_mask);
  if (server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("could not listen on unix:", options_.socket_path,
                                               options_.tcp_port > 0
                                                   ? absl::StrCat(" and ", options_.tcp_host, ":",
                                                                  options_.tcp_port)
                                                   : ""));
  }
  chmod(options_.socket_path.c_str(), 0600);
  if (options_.tcp_port > 0 && bound_tcp == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options_.tcp_host, ":", options_.tcp_port));
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
  auto& m = state->metrics;
  m.SetLimit("max_sessions", options_.max_sessions);
  m.SetLimit("max_pending_fds_per_session", shm::SessionManager::kMaxPendingFds);
  m.SetLimit("max_regions_per_session", static_cast<double>(limits.max_regions_per_session));
  m.SetLimit("max_regions", static_cast<double>(limits.max_regions));
  m.SetLimit("max_region_bytes_per_session", static_cast<double>(limits.max_bytes_per_session));
  m.SetLimit("max_region_bytes", static_cast<double>(limits.max_total_bytes));
  m.SetLimit("max_region_mappings", static_cast<double>(limits.max_mappings));
  m.SetLimit("max_call_groups", options_.max_call_groups);
  m.SetLimit("max_peers", options_.max_peers);
  m.SetLimit("max_message_bytes", 64 << 20);
  m.SetLimit("plan_cache_bytes", static_cast<double>(plan::PlanCacheOptions().max_bytes));
  HSAP_LOG(INFO) << "caps: " << options_.max_sessions << " sessions, "
                 << limits.max_regions_per_session << " regions per session, "
                 << limits.max_regions << " regions, " << limits.max_bytes_per_session
                 << " bytes per session, " << limits.max_total_bytes << " bytes, "
                 << limits.max_mappings << " mappings, " << options_.max_call_groups
                 << " call groups";
}

void Daemon::SetServing(bool serving) {
  auto* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  for (const char* service : {"hsap.v1.Attention", "hsap.v1.Regions", "hsap.v1.Cluster", "hsap.v1.Plans"}) {
    health->SetServingStatus(service, serving);
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
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (cluster_start_.joinable()) cluster_start_.join();
  session_socket_.reset();  // ends every session, reclaims their regions
  exposer_.reset();
  unlink(options_.socket_path.c_str());
  HSAP_LOG(INFO) << "drained";
}

Daemon::~Daemon() {
  if (server_ != nullptr) Drain(absl::ZeroDuration());
}

}  // namespace hsap

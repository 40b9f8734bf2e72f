#include "server/daemon.h"

#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace hsap {

Daemon::Daemon(const DaemonOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  if (options.cpu_devices < 1 || options.cpu_devices > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices: cpu:", options.cpu_devices, " must name 1 to 1024 CPU slots"));
  }
  std::unique_ptr<Daemon> d(new Daemon(options));
  int threads = options.cpu_threads;
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  d->state_ = std::make_unique<DaemonState>(threads, options.cpu_devices, options.region_limits);
  for (int i = 0; i < options.cpu_devices; ++i) d->state_->device_names.push_back(absl::StrCat("cpu:", i));
  d->state_->limits.max_group_size = options.cpu_devices;
  d->state_->runner.num_nodes = 1;
  d->state_->runner.devices_per_node = options.cpu_devices;
  d->state_->runner.default_deadline = options.call_deadline;

  const uint32_t uid = options.allowed_uid >= 0 ? options.allowed_uid : getuid();
  auto sessions = shm::SessionSocket::Start(d->session_socket_path(), &d->state_->sessions, uid);
  if (!sessions.ok()) return sessions.status();
  d->session_socket_ = std::move(sessions).value();

  d->attention_ = std::make_unique<AttentionService>(d->state_.get());
  d->regions_ = std::make_unique<RegionsService>(d->state_.get());
  d->cluster_ = std::make_unique<ClusterService>(d->state_.get());
  d->plans_ = std::make_unique<PlansService>(&d->state_->plans);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  unlink(options.socket_path.c_str());
  builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  int bound_tcp = 0;
  if (options.tcp_port > 0) {
    builder.AddListeningPort(absl::StrCat(options.tcp_host, ":", options.tcp_port),
                             grpc::InsecureServerCredentials(), &bound_tcp);
  }
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(d->attention_.get());
  builder.RegisterService(d->regions_.get());
  builder.RegisterService(d->cluster_.get());
  builder.RegisterService(d->plans_.get());
  const mode_t old_mask = umask(0177);  // the Unix socket is created 0600
  d->server_ = builder.BuildAndStart();
  umask(old_mask);
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("could not listen on unix:", options.socket_path,
                                               options.tcp_port > 0
                                                   ? absl::StrCat(" and ", options.tcp_host, ":",
                                                                  options.tcp_port)
                                                   : ""));
  }
  chmod(options.socket_path.c_str(), 0600);
  if (options.tcp_port > 0 && bound_tcp == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.tcp_host, ":", options.tcp_port));
  }
  d->SetServing(true);
  HSAP_LOG(INFO) << "hsapd serving on unix:" << options.socket_path << " (sessions: "
                 << d->session_socket_path() << ")"
                 << (options.tcp_port > 0 ? absl::StrCat(", tcp ", options.tcp_host, ":", bound_tcp)
                                          : std::string(", tcp off"))
                 << "; devices cpu:" << options.cpu_devices << ", " << threads << " kernel threads";
  return d;
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
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  session_socket_.reset();  // ends every session, reclaims their regions
  unlink(options_.socket_path.c_str());
  HSAP_LOG(INFO) << "drained";
}

Daemon::~Daemon() {
  if (server_ != nullptr) Drain(absl::ZeroDuration());
}

}  // namespace hsap

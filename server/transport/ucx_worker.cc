#include "server/transport/ucx_worker.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/transport/ucx_status.h"

namespace hsap::transport {
namespace {

// Sets a UCX configuration variable unless the environment already does, so
// an operator's UCX_* always wins over the daemon's defaults.
absl::Status SetDefault(ucp_config_t* config, const char* name, const std::string& value) {
  if (std::getenv(absl::StrCat("UCX_", name).c_str()) != nullptr) return absl::OkStatus();
  HSAP_UCX_RETURN_IF_ERROR(ucp_config_modify(config, name, value.c_str()),
                           absl::StrCat("ucp_config_modify(", name, "=", value, ")"));
  return absl::OkStatus();
}

}  // namespace

std::string EagerRndvThresh(absl::string_view transports) {
  static constexpr absl::string_view kSameNode[] = {"self", "posix", "sysv", "cma",
                                                     "sm",   "shm",   "knem", "xpmem"};
  bool tcp = false;
  for (absl::string_view t : absl::StrSplit(transports, ',', absl::SkipEmpty())) {
    t = absl::StripAsciiWhitespace(t);
    if (t == "tcp") {
      tcp = true;
    } else if (std::find(std::begin(kSameNode), std::end(kSameNode), t) == std::end(kSameNode)) {
      return "";
    }
  }
  return tcp ? "inf" : "";
}

bool TransportInUse(absl::string_view transports, absl::string_view name) {
  static constexpr absl::string_view kSharedMemory[] = {"posix", "sysv", "cma", "knem", "xpmem"};
  const bool shared_memory =
      std::find(std::begin(kSharedMemory), std::end(kSharedMemory), name) != std::end(kSharedMemory);
  transports = absl::StripAsciiWhitespace(transports);
  bool exclusion = false;
  if (absl::ConsumePrefix(&transports, "^") || absl::ConsumePrefix(&transports, "\\")) {
    exclusion = true;
  }
  bool named = false;
  bool any = transports.empty();
  for (absl::string_view t : absl::StrSplit(transports, ',', absl::SkipEmpty())) {
    t = absl::StripAsciiWhitespace(t);
    if (t == "all") any = true;
    if (t == name || (shared_memory && (t == "sm" || t == "shm"))) named = true;
  }
  if (exclusion) return !named;
  return any || named;
}

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxWorkerOptions& options) {
  std::unique_ptr<UcxWorker> self(new UcxWorker());
  // Shared-memory transports take part in peer error handling only when
  // asked to, and these are UCT settings that ucp_config_modify does not
  // reach ("invalid configurations"); without them UCP refuses posix/sysv
  // for our endpoints (UCP_ERR_HANDLING_MODE_PEER) and falls back to tcp even
  // within a node. The environment is the only way in; an operator's own
  // value wins (overwrite = 0). Runs before any UCX context reads it. Only
  // for the transports in use: UCX warns about every variable it did not use.
  const char* env_transports = std::getenv("UCX_TLS");
  const std::string in_use = !options.transports.empty() ? options.transports
                             : env_transports != nullptr ? env_transports
                                                         : "";
  if (TransportInUse(in_use, "posix")) ::setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
  if (TransportInUse(in_use, "sysv")) ::setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
  ucp_config_t* config = nullptr;
  HSAP_UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  struct ConfigReleaser {
    ucp_config_t* config;
    ~ConfigReleaser() { ucp_config_release(config); }
  } releaser{config};
  if (!options.transports.empty()) {
    // An explicit choice overrides the environment.
    HSAP_UCX_RETURN_IF_ERROR(ucp_config_modify(config, "TLS", options.transports.c_str()),
                             absl::StrCat("ucp_config_modify(TLS=", options.transports, ")"));
  }
  HSAP_RETURN_IF_ERROR(SetDefault(
      config, "KEEPALIVE_INTERVAL",
      absl::StrCat(absl::ToInt64Milliseconds(options.keepalive_interval), "ms")));
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
    const char* env_tls = std::getenv("UCX_TLS");
    self->rndv_thresh_ = !options.rndv_thresh.empty() ? options.rndv_thresh
                         : !options.transports.empty() ? EagerRndvThresh(options.transports)
                         : env_tls != nullptr ? EagerRndvThresh(env_tls)
                                              : "";
    if (!self->rndv_thresh_.empty()) {
      HSAP_RETURN_IF_ERROR(SetDefault(config, "RNDV_THRESH", self->rndv_thresh_));
    }
  }

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  HSAP_UCX_RETURN_IF_ERROR(ucp_init(&params, config, &self->context_), "ucp_init");

  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Serialized: we hold mu_ around every call (see the header).
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  HSAP_UCX_RETURN_IF_ERROR(ucp_worker_create(self->context_, &worker_params, &self->worker_),
                           "ucp_worker_create");

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  HSAP_UCX_RETURN_IF_ERROR(ucp_worker_get_address(self->worker_, &address, &address_length),
                           "ucp_worker_get_address");
  self->address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(self->worker_, address);
  // Peers' addresses are checked against this one's layout (ucx_address.h).
  HSAP_ASSIGN_OR_RETURN(self->layout_, ParseOwnUcxAddress(self->address_));
  return self;
}

UcxWorker::~UcxWorker() {
  {
    absl::MutexLock lock(&mu_);
    while (!connections_.empty()) {
      auto node = connections_.begin();
      std::unique_ptr<Connection> connection = std::move(node->second);
      connections_.erase(node);
      CloseLocked(std::move(connection));
    }
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxWorker::OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  // Runs inside ucp_worker_progress or ucp_ep_close_nbx, hence under mu_.
  auto* connection = static_cast<Connection*>(arg);
  connection->error = absl::UnavailableError(
      absl::StrCat("UCX endpoint to ", connection->name,
                   " failed: ", ucs_status_string(status), " (UCS ", static_cast<int>(status),
                   "); the peer daemon died or is unreachable"));
  HSAP_LOG(WARNING) << connection->error.message();
}

absl::Status UcxWorker::ValidatePeerAddress(absl::string_view address) const {
  if (address == address_) return absl::OkStatus();
  return ValidatePeerUcxAddress(address, layout_);
}

absl::Status UcxWorker::Connect(int32_t node, absl::string_view address,
                                absl::string_view peer_name) {
  const std::string name =
      peer_name.empty() ? absl::StrCat("node ", node) : std::string(peer_name);
  if (address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty UCX worker address for ", name));
  }
  // UCX trusts the bytes (it aborts on a bad version, reads past the end):
  // nothing reaches ucp_ep_create unchecked.
  HSAP_RETURN_IF_ERROR(ValidatePeerAddress(address));
  auto connection = std::make_unique<Connection>();
  connection->worker = this;
  connection->node = node;
  connection->name = name;
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // The endpoint to this worker itself cannot lose its peer, and UCX's self
  // transport has no peer failure handler: it would be refused in PEER mode.
  params.err_mode = address == address_ ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxWorker::OnEndpointError;
  params.err_handler.arg = connection.get();

  absl::MutexLock lock(&mu_);
  auto old = connections_.find(node);
  if (old != connections_.end()) {
    std::unique_ptr<Connection> previous = std::move(old->second);
    connections_.erase(old);
    CloseLocked(std::move(previous));
  }
  HSAP_UCX_RETURN_IF_ERROR(ucp_ep_create(worker_, &params, &connection->ep),
                           absl::StrCat("ucp_ep_create(", name, ")"));
  connections_[node] = std::move(connection);
  ++generations_[node];
  return absl::OkStatus();
}

void UcxWorker::Disconnect(int32_t node) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(node);
  if (it == connections_.end()) return;
  std::unique_ptr<Connection> connection = std::move(it->second);
  connections_.erase(it);
  CloseLocked(std::move(connection));
}

void UcxWorker::CloseLocked(std::unique_ptr<Connection> connection) {
  if (connection->ep == nullptr) return;
  ucp_request_param_t params = {};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  // Forced: completes locally whatever state the peer is in (a graceful
  // close would wait for a dead peer), and fails the requests still posted
  // on the endpoint.
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(connection->ep, &params);
  if (UCS_PTR_IS_PTR(request)) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (ucp_request_check_status(request) == UCS_INPROGRESS && absl::Now() < give_up) {
      ucp_worker_progress(worker_);
    }
    if (ucp_request_check_status(request) == UCS_INPROGRESS) {
      HSAP_LOG(WARNING) << "closing the UCX endpoint to " << connection->name
                        << " did not finish in 5 s; leaving it to UCX";
      // The error handler may still run: keep its argument alive.
      connection.release();  // NOLINT: deliberately leaked (tiny), see above
    }
    ucp_request_free(request);
  }
}

absl::Status UcxWorker::NodeStatus(int32_t node) const {
  absl::MutexLock lock(&mu_);
  return NodeStatusLocked(node);
}

absl::Status UcxWorker::NodeStatusLocked(int32_t node) const {
  auto it = connections_.find(node);
  if (it == connections_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no UCX endpoint to node ", node, " (the cluster has not formed)"));
  }
  return it->second->error;
}

uint64_t UcxWorker::ConnectionGeneration(int32_t node) const {
  absl::MutexLock lock(&mu_);
  auto it = generations_.find(node);
  return it == generations_.end() ? 0 : it->second;
}

absl::StatusOr<ucp_ep_h> UcxWorker::EndpointLocked(int32_t node) const {
  HSAP_RETURN_IF_ERROR(NodeStatusLocked(node));
  return connections_.at(node)->ep;
}

unsigned UcxWorker::ProgressLocked() {
  unsigned total = 0;
  for (int i = 0; i < 64; ++i) {
    const unsigned events = ucp_worker_progress(worker_);
    if (events == 0) break;
    total += events;
  }
  return total;
}

}  // namespace hsap::transport

#include "server/cluster/cluster.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth_token.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/cluster/peer_service.h"
#include "server/cluster/peer_validation.h"
#include "server/grpc/status_util.h"

namespace hsap::cluster {

namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t value = 0;
  while (value == 0) value = absl::Uniform<uint64_t>(gen);
  return value;
}

// With TLS the channel presents this node's certificate and checks the
// peer's against the CA and `address`'s host; the token is the operators'
// credential then and is not sent. Without TLS the token (if any) rides on
// every call.
std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address, const std::string& token,
                                           const std::shared_ptr<const PeerTls>& tls) {
  grpc::ChannelArguments args;
  // A peer that comes back must be reachable again within a heartbeat or
  // two, not after gRPC's default reconnect backoff (up to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  if (tls != nullptr) return grpc::CreateCustomChannel(address, tls->ChannelCredentials(), args);
  return CreateChannelWithToken(address, token, args);
}

}  // namespace

Cluster::Cluster()
    : incarnation_(NewIncarnation()), service_(std::make_unique<PeerServiceImpl>(this)) {}

Cluster::~Cluster() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (report_thread_.joinable()) report_thread_.join();
  // It cancels and drains the run-time heartbeats in flight.
  if (liveness_thread_.joinable()) liveness_thread_.join();
}

grpc::Service* Cluster::service() { return service_.get(); }

int32_t Cluster::node_rank() const {
  absl::MutexLock lock(&mu_);
  return self_;
}

std::string Cluster::self_address() const {
  absl::MutexLock lock(&mu_);
  return options_.advertise_address;
}

absl::Status Cluster::Start(const ClusterOptions& options, transport::UcxWorker* worker) {
  const int32_t n = static_cast<int32_t>(options.peers.size());
  if (n > 0 && (options.node_rank < 0 || options.node_rank >= n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank ", options.node_rank, " outside the ", n, " peers"));
  }
  ClusterOptions o = options;
  if (n > 0 && o.advertise_address.empty()) o.advertise_address = o.peers[o.node_rank];
  if (n > 0 && o.advertise_address != o.peers[o.node_rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise_address is '", o.advertise_address, "' but this node's --peers entry (node ",
        o.node_rank, ") is '", o.peers[o.node_rank], "'; they must be equal"));
  }
  if (o.advertise_address.empty()) {
    return absl::InvalidArgumentError("no advertised address (--advertise_address) and no --peers");
  }
  if (o.max_peers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_peers is ", o.max_peers, "; it must be >= 1"));
  }
  const int32_t self = n > 0 ? o.node_rank : 0;
  if (worker != nullptr) {
    // Same-node ranks talk through this worker's endpoint to itself.
    HSAP_RETURN_IF_ERROR(worker->Connect(self, worker->Address()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("Cluster::Start called twice");
    options_ = o;
    worker_ = worker;
    peers_ = PeerTable(o.max_peers);
    groups_ = GroupTable(o.max_groups);
    num_static_ = n;
    self_ = self;
    for (int32_t node = 0; node < std::max(n, 1); ++node) {
      const std::string& address = n > 0 ? o.peers[node] : o.advertise_address;
      PeerRecord* peer = peers_.AddPinned(address, node == self);
      if (node == self) {
        peer->state = NodeState::kUp;
        peer->incarnation = incarnation_;
        peer->connected_incarnation = incarnation_;
        peer->ucx_address = worker != nullptr ? worker->Address() : "";
      } else {
        peer->stub = MakeStub(address);
      }
    }
    started_ = true;
  }
  liveness_thread_ = std::thread([this] { LivenessLoop(); });
  report_thread_ = std::thread([this] { ReportLoop(); });
  if (n == 0) {
    HSAP_LOG(INFO) << "peer layer up at " << o.advertise_address
                   << " (no static cluster: groups form at run time)";
    return absl::OkStatus();
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });

  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(this, &Cluster::FormedOrCancelledLocked),
                           options.join_timeout) &&
      FormedLocked()) {
    HSAP_LOG(INFO) << "cluster formed: node " << options.node_rank << " of " << n << ", epoch "
                   << epoch_;
    return absl::OkStatus();
  }
  if (start_wait_cancelled_) {
    return absl::UnavailableError("stopped before the cluster formed");
  }
  std::vector<std::string> missing;
  for (int32_t node = 0; node < n; ++node) {
    const PeerRecord& p = StaticPeer(node);
    if (p.state != NodeState::kUp) {
      missing.push_back(absl::StrCat(node, " (", p.address, ", ", NodeStateName(p.state), ")"));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the cluster did not form within ", absl::FormatDuration(options.join_timeout),
      "; nodes not joined: ", absl::StrJoin(missing, ", ")));
}

PeerRecord& Cluster::StaticPeer(int32_t node) const { return *peers_.Find(node); }

// REQUIRES: options_ set (Start), which never changes afterwards.
std::shared_ptr<v1::Peer::Stub> Cluster::MakeStub(const std::string& address) const
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  return std::shared_ptr<v1::Peer::Stub>(
      v1::Peer::NewStub(PeerChannel(address, options_.token, options_.tls)));
}

void Cluster::CancelStartWait() {
  absl::MutexLock lock(&mu_);
  start_wait_cancelled_ = true;
}

bool Cluster::FormedOrCancelledLocked() const { return start_wait_cancelled_ || FormedLocked(); }

bool Cluster::FormedLocked() const {
  if (!started_) return false;
  for (int32_t node = 0; node < num_static_; ++node) {
    const PeerRecord& p = StaticPeer(node);
    if (p.state != NodeState::kUp) return false;
    if (worker_ != nullptr && p.connected_incarnation != p.incarnation) return false;
  }
  return true;
}

bool Cluster::formed() const {
  absl::MutexLock lock(&mu_);
  return FormedLocked();
}

uint64_t Cluster::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::vector<NodeStatus> Cluster::NodeStates() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  std::vector<NodeStatus> states;
  for (const PeerRecord* p : peers_.All()) {
    NodeStatus s;
    s.node_rank = p->id;
    s.address = p->address;
    s.state = p->state;
    s.incarnation = p->incarnation;
    s.heartbeat_age = p->self || p->last_heard == absl::InfinitePast() ? absl::ZeroDuration()
                                                                       : now - p->last_heard;
    s.references = p->references;
    s.pinned = p->pinned;
    if (p->link.incarnation != 0) {
      s.link_bytes_per_s = p->link.bytes_per_s;
      s.link_latency_s = p->link.latency_s;
    }
    states.push_back(s);
  }
  return states;
}

void Cluster::AddNodeAbortCallback(NodeAbortCallback callback) {
  absl::MutexLock lock(&callbacks_mu_);
  node_callbacks_.push_back(std::move(callback));
}

void Cluster::AddCallAbortCallback(CallAbortCallback callback) {
  absl::MutexLock lock(&callbacks_mu_);
  call_callbacks_.push_back(std::move(callback));
}

void Cluster::RunNodeAbort(int32_t node, const absl::Status& reason) {
  std::string name = absl::StrCat("local id ", node);
  {
    absl::MutexLock lock(&mu_);
    if (const PeerRecord* p = peers_.Find(node)) name = PeerName(*p);
  }
  HSAP_LOG(WARNING) << "aborting calls with peer " << name << ": " << reason;
  std::vector<NodeAbortCallback> callbacks;
  {
    absl::MutexLock lock(&callbacks_mu_);
    callbacks = node_callbacks_;
  }
  for (auto& cb : callbacks) cb(node, reason);
}

v1::JoinRequest Cluster::MakeJoinRequest() const {
  absl::MutexLock lock(&mu_);
  v1::JoinRequest request;
  request.set_node_rank(options_.node_rank);
  request.set_num_nodes(num_static_);
  request.set_devices_per_node(options_.devices_per_node);
  request.set_incarnation(incarnation_);
  if (worker_ != nullptr) request.set_ucx_worker_address(worker_->Address());
  request.set_version(options_.version);
  return request;
}

void Cluster::PeerJoined(int32_t node, uint64_t incarnation, const std::string& ucx_address) {
  absl::Status restart;
  {
    absl::MutexLock lock(&mu_);
    PeerRecord& p = StaticPeer(node);
    if (p.incarnation != 0 && p.incarnation != incarnation) {
      restart = absl::AbortedError(absl::StrCat("node ", PeerName(p), " restarted (incarnation ",
                                                p.incarnation, " -> ", incarnation, ")"));
      p.lost = true;
      groups_.FailWithPeer(node, p.incarnation, restart);
      // Node 0 settles the static cluster's measured profiles; a restarted
      // member is probed again: settle them again (cluster_profiles.cc).
      static_profiles_.clear();
    }
    p.incarnation = incarnation;
    p.ucx_address = ucx_address;
    p.last_heard = absl::Now();
    p.join_backoff = absl::Milliseconds(50);
    if (worker_ != nullptr &&
        (p.connected_incarnation != incarnation || !worker_->NodeStatus(node).ok())) {
      // Under mu_ so that concurrent joins (its Join to us, ours to it)
      // connect once; the worker never calls back into the Cluster.
      const absl::Status connected = worker_->Connect(node, ucx_address, PeerName(p));
      if (!connected.ok()) {
        HSAP_LOG(WARNING) << "UCX connect to " << PeerName(p) << " failed: " << connected;
        p.state = NodeState::kJoining;
        return;
      }
      p.connected_incarnation = incarnation;
    }
    if (p.state != NodeState::kUp) {
      HSAP_LOG(INFO) << "node " << PeerName(p) << " (static node " << node << ") is UP";
    }
    p.state = NodeState::kUp;
    if (p.lost) {
      p.lost = false;
      ++epoch_;
      HSAP_LOG(INFO) << "cluster re-formed with " << PeerName(p) << ": epoch " << epoch_;
    }
  }
  if (!restart.ok()) RunNodeAbort(node, restart);
}

void Cluster::MarkDown(int32_t node, const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    PeerRecord* found = peers_.Find(node);
    if (found == nullptr) return;
    PeerRecord& p = *found;
    if (p.state == NodeState::kDown) return;
    // Its groups have lost a member: their later calls need a new group.
    groups_.FailWithPeer(node, 0, reason);
    p.state = NodeState::kDown;
    p.lost = true;
    p.connected_incarnation = 0;
    p.next_join = absl::InfinitePast();
    if (worker_ != nullptr) worker_->Disconnect(node);
  }
  RunNodeAbort(node, reason);
}

void Cluster::TickPeer(int32_t node) {
  NodeState state;
  uint64_t incarnation;
  v1::Peer::Stub* stub;
  std::string address;  // its PeerName, for messages
  absl::Duration rpc_timeout, suspect_after, down_after;
  {
    absl::MutexLock lock(&mu_);
    PeerRecord& p = StaticPeer(node);
    address = PeerName(p);
    state = p.state;
    incarnation = p.incarnation;
    stub = p.stub.get();
    rpc_timeout = options_.rpc_timeout;
    suspect_after = options_.suspect_after;
    down_after = options_.down_after;
    if ((state == NodeState::kJoining || state == NodeState::kDown) && absl::Now() < p.next_join) {
      return;
    }
  }
  const v1::JoinRequest join = MakeJoinRequest();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
  if (state == NodeState::kJoining || state == NodeState::kDown) {
    v1::JoinResponse response;
    const grpc::Status s = stub->Join(&context, join, &response);
    // The answer is a peer's input too: checked before it reaches UCX.
    const absl::Status valid = s.ok() ? ValidateJoinResponse(response, node, UcxCheck())
                                      : absl::OkStatus();
    if (!valid.ok()) {
      HSAP_LOG(WARNING) << "node " << address << " answered Join with a bad field: " << valid;
    }
    if (s.ok() && valid.ok()) {
      PeerJoined(node, response.incarnation(), response.ucx_worker_address());
    } else {
      absl::MutexLock lock(&mu_);
      PeerRecord& p = StaticPeer(node);
      p.next_join = absl::Now() + p.join_backoff;
      p.join_backoff = std::min(p.join_backoff * 2, absl::Seconds(1));
    }
    return;
  }
  v1::HeartbeatRequest request;
  request.set_node_rank(join.node_rank());
  request.set_incarnation(incarnation_);
  request.set_epoch(epoch());
  v1::HeartbeatResponse response;
  const grpc::Status s = stub->Heartbeat(&context, request, &response);
  if (s.ok() && response.incarnation() != incarnation) {
    // It restarted and has not joined us yet: abort now; the next tick
    // joins it (fetching its new UCX address) and re-forms.
    {
      absl::MutexLock lock(&mu_);
      PeerRecord& p = StaticPeer(node);
      p.state = NodeState::kJoining;
      p.lost = true;
      groups_.FailWithPeer(node, p.incarnation,
                           absl::AbortedError(absl::StrCat("node ", address, " restarted")));
      p.incarnation = response.incarnation();
      p.connected_incarnation = 0;
      if (worker_ != nullptr) worker_->Disconnect(node);
    }
    RunNodeAbort(node, absl::AbortedError(absl::StrCat("node ", address, " restarted (incarnation ",
                                                       incarnation, " -> ",
                                                       response.incarnation(), ")")));
    return;
  }
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // It does not know us (it restarted, or marked us DOWN): join again.
    absl::MutexLock lock(&mu_);
    StaticPeer(node).state = NodeState::kJoining;
    return;
  }
  absl::Time last_heard;
  {
    absl::MutexLock lock(&mu_);
    PeerRecord& p = StaticPeer(node);
    if (s.ok()) {
      p.last_heard = absl::Now();
      p.state = NodeState::kUp;
    }
    last_heard = p.last_heard;
    const absl::Duration age = absl::Now() - last_heard;
    if (age > suspect_after && age <= down_after && p.state == NodeState::kUp) {
      p.state = NodeState::kSuspect;
    }
  }
  const absl::Duration age = absl::Now() - last_heard;
  if (age > down_after) {
    MarkDown(node, absl::UnavailableError(absl::StrCat(
                       "node ", address, " is DOWN: no heartbeat for ", absl::FormatDuration(age),
                       s.ok() ? "" : absl::StrCat(" (last error: ", s.error_message(), ")"))));
  }
}

void Cluster::HeartbeatLoop() {
  // One thread per peer, so that a hung peer's RPC timeouts never delay the
  // heartbeats of the others.
  std::vector<std::thread> threads;
  int32_t self, n;
  {
    absl::MutexLock lock(&mu_);
    self = self_;
    n = num_static_;
  }
  for (int32_t node = 0; node < n; ++node) {
    if (node == self) continue;
    threads.emplace_back([this, node] {
      while (true) {
        TickPeer(node);
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.heartbeat_period)) return;
      }
    });
  }
  for (auto& t : threads) t.join();
}

absl::StatusOr<PeerCaller> Cluster::AuthorizePeerCall(const grpc::ServerContext& context) const {
  PeerCaller caller;
  caller.transport = context.peer();
  std::string token;
  std::shared_ptr<const PeerTls> tls;
  bool insecure = false;
  std::string self;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return caller;
    token = options_.token;
    tls = options_.tls;
    insecure = options_.insecure_peers;
    self = options_.advertise_address;
  }
  absl::Status refused;
  if (tls != nullptr) {
    absl::StatusOr<CertificateIdentity> who = tls->VerifyCaller(context);
    if (who.ok()) {
      caller.tls = true;
      caller.certificate = *std::move(who);
      return caller;
    }
    refused = who.status();
  } else if (!token.empty()) {
    refused = CheckBearerToken(context, token);
    if (refused.ok()) return caller;
  } else if (insecure) {
    return caller;
  } else {
    refused = PeersNeedCredentialsError(self);
  }
  HSAP_LOG(WARNING) << "refused a peer call from " << caller.transport << ": " << refused.message();
  return refused;
}

absl::Status Cluster::CheckClaim(const PeerCaller& caller, const std::string& claimed,
                                 absl::string_view what) const {
  if (!caller.tls || claimed.empty() || caller.certificate.NamesHostOf(claimed)) {
    return absl::OkStatus();
  }
  const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
      what, " from ", caller.transport, " claims to be ", claimed, " but its certificate (",
      caller.certificate.Describe(), ") does not name '", HostOfAddress(claimed), "'"));
  HSAP_LOG(WARNING) << "refused: " << refused.message();
  return refused;
}

grpc::Status Cluster::OnJoin(const PeerCaller& caller, const v1::JoinRequest& request,
                             v1::JoinResponse* response) {
  int32_t self, n, devices;
  std::string claimed;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
    self = self_;
    n = num_static_;
    devices = options_.devices_per_node;
    if (n == 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this node has no static cluster (--peers): groups form with JoinGroup");
    }
    if (request.node_rank() >= 0 && request.node_rank() < n) {
      claimed = options_.peers[request.node_rank()];
    }
  }
  if (absl::Status who = CheckClaim(caller, claimed, "Join"); !who.ok()) return ToGrpcStatus(who);
  // Every field, the UCX address included, before anything uses it.
  const absl::Status valid = ValidateJoinRequest(request, ClusterShape{self, n, devices}, UcxCheck());
  if (!valid.ok()) return ToGrpcStatus(valid);
  PeerJoined(request.node_rank(), request.incarnation(), request.ucx_worker_address());
  response->set_node_rank(self);
  response->set_incarnation(incarnation_);
  if (worker_ != nullptr) response->set_ucx_worker_address(worker_->Address());
  response->set_epoch(epoch());
  return grpc::Status::OK;
}

grpc::Status Cluster::OnHeartbeat(const PeerCaller& caller, const v1::HeartbeatRequest& request,
                                  v1::HeartbeatResponse* response) {
  if (caller.tls) {
    std::string claimed = request.address();
    {
      absl::MutexLock lock(&mu_);
      if (claimed.empty() && request.node_rank() >= 0 && request.node_rank() < num_static_) {
        claimed = options_.peers[request.node_rank()];
      }
    }
    if (absl::Status who = CheckClaim(caller, claimed, "Heartbeat"); !who.ok()) return ToGrpcStatus(who);
  }
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
  response->set_node_rank(self_);
  response->set_incarnation(incarnation_);
  response->set_epoch(epoch_);
  if (!request.address().empty()) {
    // A run-time peer: it learns that we are alive (and which incarnation);
    // we note that it is, if we know it with that incarnation.
    if (request.address().size() > 256) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "address: more than 256 bytes");
    }
    PeerRecord* p = peers_.FindAddress(request.address());
    if (p != nullptr && !p->pinned && p->incarnation == request.incarnation()) {
      p->last_heard = absl::Now();
    }
    return grpc::Status::OK;
  }
  const int32_t node = request.node_rank();
  if (node < 0 || node >= num_static_ || node == self_) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad node_rank");
  }
  PeerRecord& p = StaticPeer(node);
  if (p.incarnation != request.incarnation() || p.state == NodeState::kDown ||
      p.state == NodeState::kJoining) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", options_.advertise_address, " has not joined node ",
                                     p.address, "#", request.incarnation(), ": Join first"));
  }
  p.last_heard = absl::Now();
  return grpc::Status::OK;
}

std::function<absl::Status(absl::string_view)> Cluster::UcxCheck() const {
  if (worker_ == nullptr) return nullptr;
  transport::UcxWorker* worker = worker_;
  return [worker](absl::string_view address) { return worker->ValidatePeerAddress(address); };
}

}  // namespace hsap::cluster

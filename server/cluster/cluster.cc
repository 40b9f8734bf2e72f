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

namespace hsap::cluster {

const char* NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kJoining: return "JOINING";
    case NodeState::kUp: return "UP";
    case NodeState::kSuspect: return "SUSPECT";
    case NodeState::kDown: return "DOWN";
  }
  return "?";
}

struct Cluster::Peer {
  int32_t node = 0;
  std::string address;
  std::unique_ptr<v1::Peer::Stub> stub;  // null for this node
  NodeState state = NodeState::kJoining;
  uint64_t incarnation = 0;
  std::string ucx_address;
  uint64_t connected_incarnation = 0;  // incarnation whose UCX address we connected
  absl::Time last_heard = absl::InfinitePast();
  bool lost = false;  // went DOWN or restarted since it last joined: re-forming bumps the epoch
  absl::Duration join_backoff = absl::Milliseconds(50);
  absl::Time next_join = absl::InfinitePast();
};

namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  uint64_t value = 0;
  while (value == 0) value = absl::Uniform<uint64_t>(gen);
  return value;
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address, const std::string& token) {
  grpc::ChannelArguments args;
  // A peer that comes back must be reachable again within a heartbeat or
  // two, not after gRPC's default reconnect backoff (up to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
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
}

grpc::Service* Cluster::service() { return service_.get(); }

int32_t Cluster::node_rank() const {
  absl::MutexLock lock(&mu_);
  return options_.node_rank;
}

absl::Status Cluster::Start(const ClusterOptions& options, transport::UcxWorker* worker) {
  const int32_t n = static_cast<int32_t>(options.peers.size());
  if (n < 1) return absl::InvalidArgumentError("--peers lists no node");
  if (options.node_rank < 0 || options.node_rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank ", options.node_rank, " outside the ", n, " peers"));
  }
  if (worker != nullptr) {
    // Same-node ranks talk through this worker's endpoint to itself.
    HSAP_RETURN_IF_ERROR(worker->Connect(options.node_rank, worker->Address()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("Cluster::Start called twice");
    options_ = options;
    worker_ = worker;
    for (int32_t node = 0; node < n; ++node) {
      auto peer = std::make_unique<Peer>();
      peer->node = node;
      peer->address = options.peers[node];
      if (node == options.node_rank) {
        peer->state = NodeState::kUp;
        peer->incarnation = incarnation_;
        peer->connected_incarnation = incarnation_;
        peer->ucx_address = worker != nullptr ? worker->Address() : "";
      } else {
        peer->stub = v1::Peer::NewStub(PeerChannel(peer->address, options.token));
      }
      peers_.push_back(std::move(peer));
    }
    started_ = true;
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });

  absl::MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(absl::Condition(this, &Cluster::FormedLocked), options.join_timeout)) {
    HSAP_LOG(INFO) << "cluster formed: node " << options.node_rank << " of " << n << ", epoch "
                   << epoch_;
    return absl::OkStatus();
  }
  std::vector<std::string> missing;
  for (const auto& p : peers_) {
    if (p->state != NodeState::kUp) {
      missing.push_back(absl::StrCat(p->node, " (", p->address, ", ", NodeStateName(p->state), ")"));
    }
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the cluster did not form within ", absl::FormatDuration(options.join_timeout),
      "; nodes not joined: ", absl::StrJoin(missing, ", ")));
}

bool Cluster::FormedLocked() const {
  if (!started_) return false;
  for (const auto& p : peers_) {
    if (p->state != NodeState::kUp) return false;
    if (worker_ != nullptr && p->connected_incarnation != p->incarnation) return false;
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
  for (const auto& p : peers_) {
    NodeStatus s;
    s.node_rank = p->node;
    s.address = p->address;
    s.state = p->state;
    s.incarnation = p->incarnation;
    s.heartbeat_age = p->node == options_.node_rank || p->last_heard == absl::InfinitePast()
                          ? absl::ZeroDuration()
                          : now - p->last_heard;
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
  HSAP_LOG(WARNING) << "aborting calls with node " << node << ": " << reason;
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
  request.set_num_nodes(static_cast<int32_t>(peers_.size()));
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
    Peer& p = *peers_[node];
    if (p.incarnation != 0 && p.incarnation != incarnation) {
      restart = absl::AbortedError(absl::StrCat("node ", node, " restarted (incarnation ",
                                                p.incarnation, " -> ", incarnation, ")"));
      p.lost = true;
    }
    p.incarnation = incarnation;
    p.ucx_address = ucx_address;
    p.last_heard = absl::Now();
    p.join_backoff = absl::Milliseconds(50);
    if (worker_ != nullptr &&
        (p.connected_incarnation != incarnation || !worker_->NodeStatus(node).ok())) {
      // Under mu_ so that concurrent joins (its Join to us, ours to it)
      // connect once; the worker never calls back into the Cluster.
      const absl::Status connected = worker_->Connect(node, ucx_address);
      if (!connected.ok()) {
        HSAP_LOG(WARNING) << "UCX connect to node " << node << " failed: " << connected;
        p.state = NodeState::kJoining;
        return;
      }
      p.connected_incarnation = incarnation;
    }
    if (p.state != NodeState::kUp) {
      HSAP_LOG(INFO) << "node " << node << " (" << p.address << ") is UP, incarnation "
                     << incarnation;
    }
    p.state = NodeState::kUp;
    if (p.lost) {
      p.lost = false;
      ++epoch_;
      HSAP_LOG(INFO) << "cluster re-formed with node " << node << ": epoch " << epoch_;
    }
  }
  if (!restart.ok()) RunNodeAbort(node, restart);
}

void Cluster::MarkDown(int32_t node, const absl::Status& reason) {
  {
    absl::MutexLock lock(&mu_);
    Peer& p = *peers_[node];
    if (p.state == NodeState::kDown) return;
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
  absl::Duration rpc_timeout, suspect_after, down_after;
  {
    absl::MutexLock lock(&mu_);
    Peer& p = *peers_[node];
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
      HSAP_LOG(WARNING) << "node " << node << " answered Join with a bad field: " << valid;
    }
    if (s.ok() && valid.ok()) {
      PeerJoined(node, response.incarnation(), response.ucx_worker_address());
    } else {
      absl::MutexLock lock(&mu_);
      Peer& p = *peers_[node];
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
      Peer& p = *peers_[node];
      p.state = NodeState::kJoining;
      p.lost = true;
      p.incarnation = response.incarnation();
      p.connected_incarnation = 0;
      if (worker_ != nullptr) worker_->Disconnect(node);
    }
    RunNodeAbort(node, absl::AbortedError(absl::StrCat("node ", node, " restarted (incarnation ",
                                                       incarnation, " -> ",
                                                       response.incarnation(), ")")));
    return;
  }
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    // It does not know us (it restarted, or marked us DOWN): join again.
    absl::MutexLock lock(&mu_);
    peers_[node]->state = NodeState::kJoining;
    return;
  }
  absl::Time last_heard;
  {
    absl::MutexLock lock(&mu_);
    Peer& p = *peers_[node];
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
                       "node ", node, " is DOWN: no heartbeat for ", absl::FormatDuration(age),
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
    self = options_.node_rank;
    n = static_cast<int32_t>(peers_.size());
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

grpc::Status Cluster::CheckPeerToken(const grpc::ServerContext& context) const {
  std::string token;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return grpc::Status::OK;
    token = options_.token;
  }
  if (token.empty()) return grpc::Status::OK;
  const absl::Status st = CheckBearerToken(context, token);
  return st.ok() ? grpc::Status::OK : ToGrpc(st);
}

grpc::Status Cluster::OnJoin(const v1::JoinRequest& request, v1::JoinResponse* response) {
  int32_t self, n, devices;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
    self = options_.node_rank;
    n = static_cast<int32_t>(peers_.size());
    devices = options_.devices_per_node;
  }
  // Every field, the UCX address included, before anything uses it.
  const absl::Status valid = ValidateJoinRequest(request, ClusterShape{self, n, devices}, UcxCheck());
  if (!valid.ok()) return ToGrpc(valid);
  PeerJoined(request.node_rank(), request.incarnation(), request.ucx_worker_address());
  response->set_node_rank(self);
  response->set_incarnation(incarnation_);
  if (worker_ != nullptr) response->set_ucx_worker_address(worker_->Address());
  response->set_epoch(epoch());
  return grpc::Status::OK;
}

grpc::Status Cluster::OnHeartbeat(const v1::HeartbeatRequest& request,
                                  v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
  const int32_t node = request.node_rank();
  if (node < 0 || node >= static_cast<int32_t>(peers_.size()) || node == options_.node_rank) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad node_rank");
  }
  Peer& p = *peers_[node];
  if (p.incarnation != request.incarnation() || p.state == NodeState::kDown ||
      p.state == NodeState::kJoining) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", options_.node_rank, " has not joined node ", node,
                                     " incarnation ", request.incarnation(), ": Join first"));
  }
  p.last_heard = absl::Now();
  response->set_node_rank(options_.node_rank);
  response->set_incarnation(incarnation_);
  response->set_epoch(epoch_);
  return grpc::Status::OK;
}

// Checks the fields every per-call peer request carries: the sender is
// another member, the group is named. INVALID_ARGUMENT names the field;
// UNAVAILABLE before Start (no membership yet).
absl::Status Cluster::ValidateCallRequest(int32_t node_rank, const std::string& group) const {
  int32_t self, n;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return absl::UnavailableError("not started");
    self = options_.node_rank;
    n = static_cast<int32_t>(peers_.size());
  }
  if (node_rank < 0 || node_rank >= n || node_rank == self) {
    return absl::InvalidArgumentError(absl::StrCat("node_rank ", node_rank,
                                                   " is not another node of the ", n,
                                                   "-node cluster (this is node ", self, ")"));
  }
  return ValidateCallFields(group, nullptr);
}

std::function<absl::Status(absl::string_view)> Cluster::UcxCheck() const {
  if (worker_ == nullptr) return nullptr;
  transport::UcxWorker* worker = worker_;
  return [worker](absl::string_view address) { return worker->ValidatePeerAddress(address); };
}

grpc::Status Cluster::OnAgreePlan(const v1::AgreePlanRequest& request,
                                  v1::AgreePlanResponse* response) {
  absl::Status valid = ValidateCallRequest(request.node_rank(), request.group());
  if (valid.ok()) valid = ValidateCallFields(request.group(), &request.plan_key());
  if (valid.ok()) valid = ValidateRecvCommId(request.recv_comm_id());
  if (!valid.ok()) return ToGrpc(valid);
  const CallKey call{request.group(), request.call_seq(), request.backward()};
  uint32_t my_comm = 0;
  const std::string mine = agreement_.OnRemote(call, request.node_rank(), request.plan_key(),
                                               request.recv_comm_id(), &my_comm);
  response->set_agreed(mine == request.plan_key());
  if (mine == request.plan_key()) response->set_recv_comm_id(my_comm);
  if (mine != request.plan_key()) response->set_plan_key(mine);
  return grpc::Status::OK;
}

grpc::Status Cluster::OnAbortCall(const v1::AbortCallRequest& request) {
  absl::Status valid = ValidateCallRequest(request.node_rank(), request.group());
  if (valid.ok()) valid = ValidateAbortFields(request);
  if (!valid.ok()) return ToGrpc(valid);
  ApplyAbort(request);
  return grpc::Status::OK;
}

void Cluster::ApplyAbort(const v1::AbortCallRequest& request) {
  absl::Status reason(static_cast<absl::StatusCode>(request.code()),
                      absl::StrCat("node ", request.node_rank(), ": ", request.message()));
  if (reason.ok()) reason = absl::AbortedError(absl::StrCat("aborted by node ", request.node_rank()));
  {
    absl::MutexLock lock(&mu_);
    aborted_calls_[{request.group(), request.call_seq(), false}] = reason;
    if (aborted_calls_.size() > 4096) aborted_calls_.erase(aborted_calls_.begin());
  }
  std::vector<CallAbortCallback> callbacks;
  {
    absl::MutexLock lock(&callbacks_mu_);
    callbacks = call_callbacks_;
  }
  for (auto& cb : callbacks) cb(request.group(), request.call_seq(), reason);
}

void Cluster::AbortCall(const std::string& group, uint64_t call_seq, const absl::Status& reason,
                        const std::vector<int32_t>& members) {
  v1::AbortCallRequest request;
  request.set_group(group);
  request.set_call_seq(call_seq);
  request.set_code(static_cast<int32_t>(reason.code()));
  request.set_message(std::string(reason.message()));
  std::vector<v1::Peer::Stub*> stubs;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    request.set_node_rank(options_.node_rank);
    rpc_timeout = options_.rpc_timeout;
    for (const auto& p : peers_) {
      if (!members.empty() && std::find(members.begin(), members.end(), p->node) == members.end()) {
        continue;
      }
      if (p->stub != nullptr && p->state != NodeState::kDown) stubs.push_back(p->stub.get());
    }
  }
  ApplyAbort(request);
  for (v1::Peer::Stub* stub : stubs) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    v1::AbortCallResponse response;
    stub->AbortCall(&context, request, &response);  // best effort
  }
}

void Cluster::EndCall(const std::string& group, uint64_t call_seq) {
  agreement_.EndLocal(group, call_seq);
}

absl::StatusOr<std::vector<uint32_t>> Cluster::AgreePlan(const CallKey& call,
                                                         const std::string& plan_key,
                                                         uint32_t recv_comm, absl::Time deadline,
                                                         const std::vector<int32_t>& members) {
  HSAP_RETURN_IF_ERROR(ValidateRecvCommId(recv_comm));
  {
    absl::MutexLock lock(&mu_);
    HSAP_RETURN_IF_ERROR(ValidateMemberNodes(call.group, members,
                                             static_cast<int32_t>(peers_.size()),
                                             options_.node_rank));
  }
  HSAP_RETURN_IF_ERROR(agreement_.SetLocal(call, plan_key, recv_comm));
  std::vector<std::pair<int32_t, v1::Peer::Stub*>> pending;
  std::vector<uint64_t> incarnation;  // per node, when the agreement started
  std::vector<uint32_t> recv_comm_of_node;
  v1::AgreePlanRequest request;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return absl::FailedPreconditionError("the cluster has not started");
    for (const auto& p : peers_) {
      const bool member =
          members.empty() || std::find(members.begin(), members.end(), p->node) != members.end();
      if (member && p->stub != nullptr) pending.emplace_back(p->node, p->stub.get());
      incarnation.push_back(p->incarnation);
    }
    recv_comm_of_node.assign(peers_.size(), 0);
    recv_comm_of_node[options_.node_rank] = recv_comm;
    request.set_node_rank(options_.node_rank);
    rpc_timeout = options_.rpc_timeout;
  }
  request.set_group(call.group);
  request.set_call_seq(call.call_seq);
  request.set_plan_key(plan_key);
  request.set_backward(call.backward);
  request.set_recv_comm_id(recv_comm);
  while (!pending.empty()) {
    {
      absl::MutexLock lock(&mu_);
      auto aborted = aborted_calls_.find({call.group, call.call_seq, false});
      if (aborted != aborted_calls_.end()) return aborted->second;
      // A node we wait for that went DOWN or restarted will never confirm:
      // end now, not at the deadline.
      for (const auto& [node, stub] : pending) {
        const Peer& p = *peers_[node];
        if (p.state == NodeState::kDown || p.incarnation != incarnation[node]) {
          return absl::UnavailableError(absl::StrCat(
              "plan agreement for group '", call.group, "' call_seq ", call.call_seq,
              ": node ", node, p.state == NodeState::kDown ? " is down" : " restarted"));
        }
      }
    }
    for (auto it = pending.begin(); it != pending.end();) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + rpc_timeout)));
      v1::AgreePlanResponse response;
      const grpc::Status s = it->second->AgreePlan(&context, request, &response);
      if (s.ok() && response.agreed()) {
        const absl::Status comm = ValidateRecvCommId(response.recv_comm_id());
        if (!comm.ok()) {
          return absl::InternalError(absl::StrCat("plan agreement for group '", call.group,
                                                  "' call_seq ", call.call_seq, ": node ",
                                                  it->first, " answered ", comm.message()));
        }
        recv_comm_of_node[it->first] = response.recv_comm_id();
        it = pending.erase(it);
        continue;
      }
      if (s.ok() && !response.plan_key().empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "plan mismatch for group '", call.group, "' call_seq ", call.call_seq,
            call.backward ? " (backward)" : " (forward)", ": this node runs plan ", plan_key,
            ", node ", it->first, " runs ", response.plan_key()));
      }
      ++it;  // not seen there yet, or unreachable: ask again
    }
    if (pending.empty()) break;
    if (absl::Now() >= deadline) {
      std::vector<int32_t> nodes;
      for (const auto& [node, stub] : pending) nodes.push_back(node);
      return absl::DeadlineExceededError(
          absl::StrCat("plan agreement for group '", call.group, "' call_seq ", call.call_seq,
                       " passed its deadline; nodes that have not confirmed: ",
                       absl::StrJoin(nodes, ", ")));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return recv_comm_of_node;
}

}  // namespace hsap::cluster

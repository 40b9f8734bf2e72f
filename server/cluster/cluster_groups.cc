// Cluster: the groups formed at run time (AcquireGroup, ReleaseGroup, the
// peers they learn) and the liveness of their run-time peers. Their
// formation protocol is in cluster_formation.cc. See cluster.h.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_validation.h"

namespace hsap::cluster {
// One run-time heartbeat in flight on the liveness thread's completion
// queue. It holds the peer's stub (and so its channel) until the liveness
// thread deletes it: a channel must not be destroyed on a gRPC thread.
struct Cluster::HeartbeatCall {
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
  grpc::Status status;
  std::shared_ptr<v1::Peer::Stub> stub;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> reader;
  int32_t peer = 0;
  uint64_t sent_to = 0;  // the incarnation it was sent to
};

absl::StatusOr<std::vector<int32_t>> Cluster::AcquireGroup(const std::string& group,
                                                           const std::vector<std::string>& nodes,
                                                           int32_t node_index,
                                                           int32_t ranks_per_node) {
  absl::MutexLock lock(&mu_);
  if (!started_) return absl::FailedPreconditionError("the peer layer has not started");
  if (node_index < 0 || node_index >= static_cast<int32_t>(nodes.size()) ||
      nodes[node_index] != options_.advertise_address) {
    // Not this daemon's place: nobody of the group is told (it is not one
    // of its members); the real member never joins and the group fails by
    // --group_form_timeout_ms, naming it.
    return absl::InvalidArgumentError(absl::StrCat(
        "group '", group, "': node_index ", node_index, " does not name this daemon ('",
        options_.advertise_address, "') in [", absl::StrJoin(nodes, ", "), "]"));
  }
  bool added = false;
  absl::StatusOr<std::shared_ptr<GroupEntry>> found =
      groups_.FindOrAdd(group, nodes, node_index, &added);
  if (!found.ok()) {
    // Another member list under the name, or --max_call_groups: the
    // group's other nodes learn it at once (a FAILED group already failed
    // there too, or will by its own cause).
    if (!absl::IsFailedPrecondition(found.status())) {
      RecordRefusalLocked(group, nodes, node_index, found.status(), /*report=*/true);
    }
    return found.status();
  }
  std::shared_ptr<GroupEntry> g = *std::move(found);
  const absl::Time now = absl::Now();
  if (added) {
    refusals_.erase(group);
    bool all_pinned = true;
    for (size_t i = 0; i < nodes.size(); ++i) {
      GroupMember& m = g->members[i];
      if (static_cast<int32_t>(i) == node_index) {
        m.peer = self_;
        m.incarnation = incarnation_;
        m.joined = true;
        continue;
      }
      absl::StatusOr<PeerRecord*> peer = peers_.Reference(
          nodes[i], [this](const std::string& a) { return MakeStub(a); });
      if (peer.ok() && (*peer)->self) {
        peer = absl::InvalidArgumentError(absl::StrCat(
            "group '", group, "': call.nodes[", i, "] '", nodes[i], "' is this daemon, which is "
            "call.nodes[", node_index, "]"));
      }
      if (!peer.ok()) {
        for (size_t j = 0; j < i; ++j) {
          if (static_cast<int32_t>(j) != node_index) peers_.Unreference(g->members[j].peer, now);
        }
        groups_.Remove(group);
        RecordRefusalLocked(group, nodes, node_index, peer.status(), /*report=*/true);
        return peer.status();
      }
      m.peer = (*peer)->id;
      if ((*peer)->pinned) {
        m.incarnation = (*peer)->incarnation;
        m.joined = true;
      } else {
        all_pinned = false;
      }
    }
    // The root's uid: its incarnation and a counter (unique among its
    // groups); a group of static nodes only takes one here at once.
    if (node_index == 0 || all_pinned) g->uid = incarnation_ ^ ++next_group_uid_;
    if (all_pinned) {
      g->state = GroupState::kUp;  // the static cluster's peers: trusted as such, no key
    } else if (node_index == 0) {
      g->key = NewGroupSecret();
    }
  }
  std::vector<int32_t> ids = g->peers();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (static_cast<int32_t>(i) != node_index) (void)peers_.Reference(nodes[i], nullptr);
  }
  if (ranks_per_node > 0) g->ranks_per_node = ranks_per_node;
  ++g->calls;
  return ids;
}

void Cluster::ReleaseCallPeers(const std::vector<int32_t>& peers) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  for (int32_t id : peers) {
    if (id != self_) peers_.Unreference(id, now);
  }
}

void Cluster::ReleaseGroup(const std::string& group) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<GroupEntry> g = groups_.Remove(group);
  if (g == nullptr) return;
  // Members that come late learn why (JoinGroup, ConfirmMember).
  if (g->state == GroupState::kFailed) {
    RecordRefusalLocked(group, g->addresses(), g->node_index, g->failure, /*report=*/false);
  }
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < g->members.size(); ++i) {
    if (static_cast<int32_t>(i) != g->node_index) peers_.Unreference(g->members[i].peer, now);
  }
}

void Cluster::FailGroupLocked(GroupEntry& group, const absl::Status& reason) {
  if (group.state == GroupState::kFailed) return;
  group.state = GroupState::kFailed;
  group.failure = reason;
  HSAP_LOG(WARNING) << "group '" << group.name << "' failed: " << reason;
}

absl::Status Cluster::LearnPeerLocked(int32_t peer, uint64_t incarnation,
                                      const std::string& ucx_address, absl::Status* restart) {
  PeerRecord* p = peers_.Find(peer);
  if (p == nullptr) return absl::InternalError(absl::StrCat("peer ", peer, " is not known"));
  if (p->pinned) return absl::OkStatus();  // the static protocol keeps it
  if (p->incarnation != 0 && p->incarnation != incarnation) {
    *restart = absl::AbortedError(absl::StrCat("node ", PeerName(*p), " restarted (incarnation ",
                                               p->incarnation, " -> ", incarnation, ")"));
    groups_.FailWithPeer(peer, p->incarnation, *restart);
  }
  // A peer back from parking keeps its endpoint while the incarnation is
  // the one it was connected to (peer_table.h).
  const bool connect = p->connected_incarnation != incarnation ||
                       (worker_ != nullptr && !worker_->NodeStatus(peer).ok());
  p->incarnation = incarnation;
  p->ucx_address = ucx_address;
  if (worker_ != nullptr && connect) {
    // Once per incarnation: Connect force-closes the endpoint, which would
    // fail every other group's transfers with this peer.
    const absl::Status connected = worker_->Connect(peer, ucx_address, PeerName(*p));
    if (!connected.ok()) {
      return absl::UnavailableError(
          absl::StrCat("UCX connect to ", p->address, " failed: ", connected.message()));
    }
    p->connected_incarnation = incarnation;
  }
  if (p->state != NodeState::kUp) {
    HSAP_LOG(INFO) << "peer " << PeerName(*p) << " is UP (local id " << peer << ")";
  }
  p->state = NodeState::kUp;
  p->last_heard = absl::Now();
  return absl::OkStatus();
}

std::vector<GroupStatus> Cluster::GroupStates() const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupStatus> out;
  for (const auto& g : groups_.All()) {
    GroupStatus s;
    s.name = g->name;
    s.state = g->state;
    s.uid = g->uid;
    s.ranks_per_node = g->ranks_per_node;
    s.calls = g->calls;
    for (const GroupMember& m : g->members) s.nodes.push_back(m.address);
    for (const auto& [key, profile] : g->profiles) {
      s.profiles.push_back(absl::StrCat(DTypeName(static_cast<DType>(key.first)), "/d",
                                        key.second, " ", profile));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::array<int, 3> Cluster::GroupCounts() const {
  absl::MutexLock lock(&mu_);
  return groups_.CountByState();
}

std::array<int, 4> Cluster::PeerCounts() const {
  absl::MutexLock lock(&mu_);
  std::array<int, 4> counts{};
  for (const PeerRecord* p : peers_.All()) {
    if (!p->pinned) ++counts[static_cast<int>(p->state)];
  }
  return counts;
}

void Cluster::LivenessLoop() {
  // Heartbeats go out asynchronously (a hung peer delays no other) on this
  // thread's own completion queue, which this thread also drains.
  grpc::CompletionQueue cq;
  absl::flat_hash_set<HeartbeatCall*> in_flight;
  absl::Duration period;
  {
    absl::MutexLock lock(&mu_);
    period = options_.heartbeat_period;
  }
  absl::Time next_tick = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    if (absl::Now() >= next_tick) {
      LivenessTick(&cq, &in_flight);
      next_tick = absl::Now() + period;
    }
    void* tag = nullptr;
    bool ok = false;
    if (cq.AsyncNext(&tag, &ok, absl::ToChronoTime(next_tick)) ==
        grpc::CompletionQueue::GOT_EVENT) {
      auto* call = static_cast<HeartbeatCall*>(tag);
      in_flight.erase(call);
      OnRuntimeHeartbeat(call->peer, call->sent_to, call->status, call->response.incarnation());
      delete call;
    }
  }
  for (HeartbeatCall* call : in_flight) call->context.TryCancel();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) delete static_cast<HeartbeatCall*>(tag);
}

void Cluster::LivenessTick(grpc::CompletionQueue* cq, absl::flat_hash_set<HeartbeatCall*>* in_flight) {
  std::vector<std::pair<int32_t, absl::Status>> downs;
  std::vector<HeartbeatCall*> calls;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (PeerRecord* p : peers_.All()) {
      // Static peers have their own threads; a run-time peer is watched
      // from its first formation on.
      if (p->pinned || p->incarnation == 0 || p->state == NodeState::kDown) continue;
      const absl::Duration age = now - p->last_heard;
      if (age > options_.down_after) {
        downs.emplace_back(p->id, absl::UnavailableError(absl::StrCat(
                                      "node ", PeerName(*p), " is DOWN: no heartbeat for ",
                                      absl::FormatDuration(age))));
        continue;
      }
      if (age > options_.suspect_after && p->state == NodeState::kUp) p->state = NodeState::kSuspect;
      if (p->heartbeat_in_flight || p->stub == nullptr) continue;
      auto* call = new HeartbeatCall;
      call->stub = p->stub;
      call->peer = p->id;
      call->sent_to = p->incarnation;
      call->context.set_deadline(absl::ToChronoTime(now + options_.rpc_timeout));
      call->request.set_node_rank(self_);
      call->request.set_incarnation(incarnation_);
      call->request.set_address(options_.advertise_address);
      p->heartbeat_in_flight = true;
      calls.push_back(call);
    }
    std::vector<int32_t> close;
    for (auto& gone : peers_.TakeExpired(now, options_.peer_linger, &close)) {
      HSAP_LOG(INFO) << "peer " << PeerName(*gone) << " (local id " << gone->id
                     << ") released: no live group uses it (its UCX endpoint stays parked)";
    }
    for (int32_t id : close) {
      if (worker_ != nullptr) worker_->Disconnect(id);
    }
  }
  for (const auto& [peer, why] : downs) MarkDown(peer, why);
  for (HeartbeatCall* call : calls) {
    call->reader = call->stub->AsyncHeartbeat(&call->context, call->request, cq);
    call->reader->Finish(&call->response, &call->status, call);
    in_flight->insert(call);
  }
}

void Cluster::OnRuntimeHeartbeat(int32_t peer, uint64_t incarnation, const grpc::Status& status,
                                 uint64_t answered_incarnation) {
  absl::Status restart;
  {
    absl::MutexLock lock(&mu_);
    PeerRecord* p = peers_.Find(peer);
    if (p == nullptr) return;
    p->heartbeat_in_flight = false;
    if (stopping_ || !status.ok() || p->incarnation != incarnation) return;
    if (p->state == NodeState::kDown) return;
    if (answered_incarnation != incarnation) {
      restart = absl::AbortedError(absl::StrCat("node ", PeerName(*p), " restarted (incarnation ",
                                                incarnation, " -> ", answered_incarnation, ")"));
      groups_.FailWithPeer(peer, incarnation, restart);
      p->state = NodeState::kDown;
      p->connected_incarnation = 0;
      if (worker_ != nullptr) worker_->Disconnect(peer);
    } else {
      p->last_heard = absl::Now();
      p->state = NodeState::kUp;
    }
  }
  if (!restart.ok()) RunNodeAbort(peer, restart);
}

}  // namespace hsap::cluster

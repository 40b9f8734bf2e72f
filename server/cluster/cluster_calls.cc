// Cluster: the per-call peer protocol (plan agreement, call aborts) among
// a call's member nodes. See cluster.h.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth_token.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/cluster/cluster.h"
#include "server/cluster/peer_validation.h"
#include "server/grpc/status_util.h"

namespace hsap::cluster {
namespace {

const grpc::Status kNotStarted(grpc::StatusCode::UNAVAILABLE, "not started");

}  // namespace

absl::StatusOr<int32_t> Cluster::SenderPeer(int32_t node_rank, const std::string& address,
                                            uint64_t incarnation, const std::string& group) const {
  HSAP_RETURN_IF_ERROR(ValidateCallFields(group, nullptr));
  absl::MutexLock lock(&mu_);
  if (!started_) return absl::UnavailableError("not started");
  if (!address.empty()) {
    HSAP_RETURN_IF_ERROR(ValidateNodeAddress("address", address));
    const PeerRecord* p = peers_.FindAddress(address);
    if (p == nullptr || p->self) {
      return absl::NotFoundError(absl::StrCat("'", address, "' is not a peer of this node"));
    }
    if (!p->pinned && p->incarnation != 0 && incarnation != p->incarnation) {
      return absl::NotFoundError(absl::StrCat("'", address, "' incarnation ", incarnation,
                                              " is not the one this node knows (",
                                              p->incarnation, ")"));
    }
    return p->id;
  }
  if (node_rank < 0 || node_rank >= num_static_ || node_rank == self_) {
    return absl::InvalidArgumentError(absl::StrCat("node_rank ", node_rank,
                                                   " is not another node of the ", num_static_,
                                                   "-node cluster (this is node ", self_, ")"));
  }
  return node_rank;
}

std::string Cluster::GroupKeyLocked(const std::string& group) const {
  std::shared_ptr<GroupEntry> g = groups_.Find(group);
  return g == nullptr ? std::string() : g->key;
}

absl::Status Cluster::CheckCallSenderLocked(absl::string_view what, const std::string& group,
                                            int32_t sender, const std::string& sender_name,
                                            uint64_t incarnation, const std::string& key,
                                            bool* not_formed) const {
  *not_formed = false;
  const PeerRecord* p = sender >= 0 ? peers_.Find(sender) : nullptr;
  std::shared_ptr<GroupEntry> g = groups_.Find(group);
  if (g == nullptr) {
    // The static cluster's calls declare no group here: its nodes speak.
    if (p != nullptr && p->pinned && !p->self) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        what, " from ", sender_name, " for group '", group, "' refused: this daemon (",
        options_.advertise_address, ") has no multi-node group of that name with ", sender_name,
        " as a member"));
  }
  const GroupMember* m = sender >= 0 ? g->MemberOfPeer(sender) : nullptr;
  if (m == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " from ", sender_name, " for group '", group, "' refused: ", sender_name,
        " is not a member of the group (members [", absl::StrJoin(g->addresses(), ", "), "])"));
  }
  if (p != nullptr && !p->pinned && m->joined && m->incarnation != incarnation) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " from ", sender_name, " for group '", group, "' refused: the group's member ",
        m->address, " has incarnation ", m->incarnation));
  }
  if (g->state != GroupState::kUp) {
    // Forming here: neither its key nor its members are settled yet.
    *not_formed = true;
    return absl::OkStatus();
  }
  if (!g->key.empty() && !TokensEqual(key, g->key)) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " from ", sender_name, " for group '", group,
        "' refused: it does not carry the group's key (it did not join the group through its "
        "root)"));
  }
  return absl::OkStatus();
}

grpc::Status Cluster::OnAgreePlan(const PeerCaller& caller, const v1::AgreePlanRequest& request,
                                  v1::AgreePlanResponse* response) {
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return kNotStarted;
  }
  absl::Status valid = ValidateCallFields(request.group(), &request.plan_key());
  if (valid.ok()) valid = ValidateRecvCommId(request.recv_comm_id());
  if (!valid.ok()) return ToGrpcStatus(valid);
  absl::StatusOr<int32_t> sender = SenderPeer(request.node_rank(), request.address(),
                                              request.incarnation(), request.group());
  if (!sender.ok() && !absl::IsNotFound(sender.status())) return ToGrpcStatus(sender.status());
  const std::string name = SenderName(request.node_rank(), request.address(), request.incarnation());
  if (absl::Status who = CheckClaim(caller, ClaimedAddress(request.node_rank(), request.address()),
                                    "AgreePlan");
      !who.ok()) {
    return ToGrpcStatus(who);
  }
  {
    absl::MutexLock lock(&mu_);
    bool not_formed = false;
    const absl::Status may = CheckCallSenderLocked("AgreePlan", request.group(),
                                                   sender.ok() ? *sender : -1, name,
                                                   request.incarnation(), request.group_key(),
                                                   &not_formed);
    if (!may.ok()) return ToGrpcStatus(may);
    if (not_formed) {
      // Not formed here yet: "not seen yet" (it asks again; this node
      // checks when its own ranks arrive). Nothing of it is kept.
      response->set_agreed(false);
      return grpc::Status::OK;
    }
  }
  const CallKey call{request.group(), request.call_seq(), request.backward()};
  uint32_t my_comm = 0;
  const std::string mine =
      agreement_.OnRemote(call, *sender, request.plan_key(), request.recv_comm_id(), &my_comm);
  response->set_agreed(mine == request.plan_key());
  if (mine == request.plan_key()) response->set_recv_comm_id(my_comm);
  if (mine != request.plan_key()) response->set_plan_key(mine);
  return grpc::Status::OK;
}

grpc::Status Cluster::OnAbortCall(const PeerCaller& caller, const v1::AbortCallRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return kNotStarted;
  }
  absl::Status valid = ValidateAbortFields(request);
  if (!valid.ok()) return ToGrpcStatus(valid);
  absl::StatusOr<int32_t> sender = SenderPeer(request.node_rank(), request.address(),
                                              request.incarnation(), request.group());
  if (!sender.ok() && !absl::IsNotFound(sender.status())) return ToGrpcStatus(sender.status());
  const std::string name = SenderName(request.node_rank(), request.address(), request.incarnation());
  if (absl::Status who = CheckClaim(caller, ClaimedAddress(request.node_rank(), request.address()),
                                    "AbortCall");
      !who.ok()) {
    return ToGrpcStatus(who);
  }
  {
    absl::MutexLock lock(&mu_);
    bool not_formed = false;
    const absl::Status may = CheckCallSenderLocked("AbortCall", request.group(),
                                                   sender.ok() ? *sender : -1, name,
                                                   request.incarnation(), request.group_key(),
                                                   &not_formed);
    if (!may.ok()) {
      HSAP_LOG(WARNING) << may.message();
      return ToGrpcStatus(may);
    }
    // A group still forming here runs no call of it yet.
    if (not_formed) return grpc::Status::OK;
  }
  ApplyAbort(request, name, /*local=*/false);
  return grpc::Status::OK;
}

std::string Cluster::SenderName(int32_t node_rank, const std::string& address,
                                uint64_t incarnation) const {
  if (!address.empty()) return absl::StrCat(address.substr(0, 256), "#", incarnation);
  absl::MutexLock lock(&mu_);
  if (node_rank >= 0 && node_rank < num_static_) {
    return absl::StrCat(PeerName(StaticPeer(node_rank)), " (static node ", node_rank, ")");
  }
  return absl::StrCat("node_rank ", node_rank);
}

std::string Cluster::ClaimedAddress(int32_t node_rank, const std::string& address) const {
  if (!address.empty()) return address;
  absl::MutexLock lock(&mu_);
  if (node_rank >= 0 && node_rank < num_static_) return options_.peers[node_rank];
  return "";
}

void Cluster::ApplyAbort(const v1::AbortCallRequest& request, const std::string& sender,
                         bool local) {
  absl::Status reason(static_cast<absl::StatusCode>(request.code()),
                      absl::StrCat("node ", sender, ": ", request.message()));
  if (reason.ok()) reason = absl::AbortedError(absl::StrCat("aborted by node ", sender));
  {
    absl::MutexLock lock(&mu_);
    aborted_calls_[{request.group(), request.call_seq(), false}] = reason;
    if (aborted_calls_.size() > 4096) aborted_calls_.erase(aborted_calls_.begin());
  }
  // A peer ends only what this node runs with it (a one-node call of the
  // same name is no peer's to end); a call that has not reached the
  // agreement here finds the abort there.
  if (!local && !agreement_.HasLocal(request.group(), request.call_seq())) return;
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
  request.set_incarnation(incarnation_);
  std::vector<std::shared_ptr<v1::Peer::Stub>> stubs;
  absl::Duration rpc_timeout;
  std::string self_name;
  {
    absl::MutexLock lock(&mu_);
    request.set_node_rank(self_);
    request.set_address(options_.advertise_address);
    request.set_group_key(GroupKeyLocked(group));
    self_name = absl::StrCat(options_.advertise_address, "#", incarnation_);
    rpc_timeout = options_.rpc_timeout;
    for (const PeerRecord* p : peers_.All()) {
      const bool member = members.empty()
                              ? p->pinned
                              : std::find(members.begin(), members.end(), p->id) != members.end();
      if (member && p->stub != nullptr && p->state != NodeState::kDown) stubs.push_back(p->stub);
    }
  }
  ApplyAbort(request, self_name, /*local=*/true);
  for (const auto& stub : stubs) {
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
                                                         const std::vector<int32_t>& members_in) {
  HSAP_RETURN_IF_ERROR(ValidateRecvCommId(recv_comm));
  struct Pending {
    size_t index;  // in members
    int32_t peer;
    std::string name;  // for messages: PeerName
    std::shared_ptr<v1::Peer::Stub> stub;
    uint64_t incarnation;  // when the agreement started
  };
  std::vector<int32_t> members = members_in;
  std::vector<Pending> pending;
  std::vector<uint32_t> recv_comm_of_node;
  v1::AgreePlanRequest request;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return absl::FailedPreconditionError("the cluster has not started");
    if (members.empty()) {
      for (int32_t node = 0; node < num_static_; ++node) members.push_back(node);
    }
    if (std::find(members.begin(), members.end(), self_) == members.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan agreement for group '", call.group, "': its members (",
          absl::StrJoin(members, ", "), ") do not include this node (", self_, ")"));
    }
    recv_comm_of_node.assign(members.size(), 0);
    for (size_t i = 0; i < members.size(); ++i) {
      const PeerRecord* p = peers_.Find(members[i]);
      if (p == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("plan agreement for group '", call.group,
                                                       "': member ", members[i],
                                                       " is not a peer of this node"));
      }
      if (p->self) {
        recv_comm_of_node[i] = recv_comm;
        continue;
      }
      pending.push_back(Pending{i, p->id, PeerName(*p), p->stub, p->incarnation});
    }
    request.set_node_rank(self_);
    request.set_address(options_.advertise_address);
    request.set_incarnation(incarnation_);
    request.set_group_key(GroupKeyLocked(call.group));
    rpc_timeout = options_.rpc_timeout;
  }
  HSAP_RETURN_IF_ERROR(agreement_.SetLocal(call, plan_key, recv_comm));
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
      for (const Pending& w : pending) {
        const PeerRecord* p = peers_.Find(w.peer);
        if (p == nullptr || p->state == NodeState::kDown || p->incarnation != w.incarnation) {
          return absl::UnavailableError(
              absl::StrCat("plan agreement for group '", call.group, "' call_seq ",
                           call.call_seq, ": node ", w.name,
                           p != nullptr && p->state == NodeState::kDown ? " is down"
                                                                        : " restarted"));
        }
      }
    }
    for (auto it = pending.begin(); it != pending.end();) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + rpc_timeout)));
      v1::AgreePlanResponse response;
      const grpc::Status s = it->stub->AgreePlan(&context, request, &response);
      if (s.ok() && response.agreed()) {
        const absl::Status comm = ValidateRecvCommId(response.recv_comm_id());
        if (!comm.ok()) {
          return absl::InternalError(absl::StrCat("plan agreement for group '", call.group,
                                                  "' call_seq ", call.call_seq, ": node ",
                                                  it->name, " answered ", comm.message()));
        }
        recv_comm_of_node[it->index] = response.recv_comm_id();
        it = pending.erase(it);
        continue;
      }
      if (s.ok() && !response.plan_key().empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "plan mismatch for group '", call.group, "' call_seq ", call.call_seq,
            call.backward ? " (backward)" : " (forward)", ": this node runs plan ", plan_key,
            ", node ", it->name, " runs ", response.plan_key()));
      }
      ++it;  // not seen there yet, or unreachable: ask again
    }
    if (pending.empty()) break;
    if (absl::Now() >= deadline) {
      std::vector<std::string> nodes;
      for (const Pending& w : pending) nodes.push_back(w.name);
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

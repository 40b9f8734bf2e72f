// Cluster: how a group formed at run time comes UP (FormGroup, JoinGroup,
// ConfirmMember) and how its formation fails: fast and by name when a node
// refuses the declaration, by --group_form_timeout_ms when a node never
// comes. See cluster.h and proto/hsap/v1/peer.proto.
//
// A member's JoinGroup is a claim ("I am nodes[i], incarnation x, UCX
// address u"); the root believes none of it on the request's word. It
// calls the claimed address back (ConfirmMember, carrying the slot's
// nonce) and takes that daemon's own account: its incarnation, UCX address
// and the member list its ranks declared, or the refusal it recorded. A
// request that differs from the account was not sent by the member
// (PERMISSION_DENIED); an account that differs from the root's list fails
// the group for everyone with both lists. Only a request that returns the
// nonce (which went to the member's address, not to the sender) is
// answered `formed`, with the group's key, which the members' per-call
// requests then carry.
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

// What a rank thread waiting for a group's formation waits on.
struct FormationWait {
  const GroupEntry* group;
  const bool* stopping;
  bool driver;  // the driver waits for the state; the others for the driver too
};

bool FormationChanged(FormationWait* w) {
  if (*w->stopping || w->group->state != GroupState::kForming) return true;
  return !w->driver && !w->group->forming;
}

int32_t IndexIn(const std::vector<std::string>& nodes, const std::string& address) {
  auto it = std::find(nodes.begin(), nodes.end(), address);
  return it == nodes.end() ? -1 : static_cast<int32_t>(it - nodes.begin());
}

constexpr size_t kMaxReports = 64;
// When a root first asks the members that have not joined, and how often.
constexpr absl::Duration kFirstMemberCheck = absl::Milliseconds(200);
constexpr absl::Duration kMemberCheckPeriod = absl::Milliseconds(250);

}  // namespace

absl::Status Cluster::FormGroup(const std::string& group, absl::Time call_deadline) {
  std::shared_ptr<GroupEntry> g;
  absl::Time deadline;
  std::string by;  // "within 5s (--group_form_timeout_ms)" or "by the call's deadline"
  {
    absl::MutexLock lock(&mu_);
    g = groups_.Find(group);
    if (g == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", group, "' is not known here (released while its call ran?)"));
    }
    FormationWait wait{g.get(), &stopping_, false};
    if (g->state == GroupState::kFailed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", group, "' failed (", g->failure.message(),
          "); form the group again under a new group name"));
    }
    while (true) {
      if (g->state == GroupState::kUp) return absl::OkStatus();
      // It failed while this rank waited: the cause itself.
      if (g->state == GroupState::kFailed) return g->failure;
      if (stopping_) return absl::UnavailableError("hsapd is stopping");
      if (!g->forming) break;
      if (!mu_.AwaitWithDeadline(absl::Condition(&FormationChanged, &wait), call_deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat("group '", group, "' did not form by the call's deadline"));
      }
    }
    g->forming = true;
    const absl::Time form_by = absl::Now() + options_.group_form_timeout;
    deadline = std::min(call_deadline, form_by);
    by = form_by < call_deadline
             ? absl::StrCat("within ", absl::FormatDuration(options_.group_form_timeout),
                            " (--group_form_timeout_ms)")
             : "by the call's deadline";
  }
  absl::Status st;
  if (g->node_index == 0) {
    // Members join on their own; the ones that have not after a moment are
    // asked (ConfirmMember), so that one which refused the group, or
    // declared another, fails it now rather than at the timeout.
    absl::Time next_ask = absl::Now() + kFirstMemberCheck;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        FormationWait wait{g.get(), &stopping_, true};
        if (mu_.AwaitWithDeadline(absl::Condition(&FormationChanged, &wait),
                                  std::min(deadline, next_ask)) ||
            absl::Now() >= deadline) {
          break;
        }
      }
      ConfirmMissingMembers(g);
      next_ask = absl::Now() + kMemberCheckPeriod;
    }
    absl::MutexLock lock(&mu_);
    if (g->state == GroupState::kUp) {
      st = absl::OkStatus();
    } else if (g->state == GroupState::kFailed) {
      st = g->failure;
    } else if (stopping_) {
      st = absl::UnavailableError("hsapd is stopping");
    } else {
      st = absl::DeadlineExceededError(absl::StrCat(
          "group '", group, "' did not form ", by, ": member node(s) ",
          absl::StrJoin(g->Missing(), ", "), " never joined its root (this node, ",
          options_.advertise_address, ")"));
    }
  } else {
    st = JoinRoot(g, deadline, by);
  }
  absl::MutexLock lock(&mu_);
  g->forming = false;
  if (!st.ok()) FailGroupLocked(*g, st);
  return st;
}

absl::Status Cluster::JoinRoot(const std::shared_ptr<GroupEntry>& g, absl::Time deadline,
                               const std::string& by) {
  v1::JoinGroupRequest request;
  std::vector<std::string> nodes;
  std::shared_ptr<v1::Peer::Stub> stub;
  std::string root_name;
  absl::Duration rpc_timeout, down_after;
  {
    absl::MutexLock lock(&mu_);
    nodes = g->addresses();
    const PeerRecord* p = peers_.Find(g->members[0].peer);
    if (p == nullptr || p->stub == nullptr) return absl::InternalError("the root has no stub");
    stub = p->stub;
    root_name = PeerName(*p);
    rpc_timeout = options_.rpc_timeout;
    down_after = options_.down_after;
    request.set_address(options_.advertise_address);
    request.set_version(options_.version);
  }
  request.set_group(g->name);
  for (const std::string& n : nodes) request.add_nodes(n);
  request.set_node_index(g->node_index);
  request.set_incarnation(incarnation_);
  if (worker_ != nullptr) request.set_ucx_worker_address(worker_->Address());
  const std::string where = absl::StrCat("group '", g->name, "': its root ", root_name);
  std::string last = "no answer yet";
  // Since when every JoinGroup failed: a root unreachable for down_after is
  // down (its liveness is not watched before the group forms).
  absl::Time failing_since = absl::InfiniteFuture();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      request.set_nonce(g->join_nonce);  // delivered by the root's ConfirmMember
    }
    grpc::ClientContext context;
    // A JoinGroup waits while the root calls this daemon back.
    context.set_deadline(
        absl::ToChronoTime(std::min(deadline, absl::Now() + 2 * rpc_timeout + absl::Seconds(1))));
    v1::JoinGroupResponse response;
    const grpc::Status s = stub->JoinGroup(&context, request, &response);
    if (s.ok() && response.formed()) {
      HSAP_RETURN_IF_ERROR(ValidateJoinGroupResponse(response, nodes, UcxCheck()));
      std::vector<std::pair<int32_t, absl::Status>> restarts;
      {
        absl::MutexLock lock(&mu_);
        for (int i = 0; i < response.members_size(); ++i) {
          if (i == g->node_index) continue;
          GroupMember& m = g->members[i];
          absl::Status restart;
          HSAP_RETURN_IF_ERROR(LearnPeerLocked(m.peer, response.members(i).incarnation(),
                                               response.members(i).ucx_worker_address(),
                                               &restart));
          if (!restart.ok()) restarts.emplace_back(m.peer, restart);
          m.incarnation = response.members(i).incarnation();
          m.ucx_address = response.members(i).ucx_worker_address();
          m.joined = true;
        }
        g->uid = response.group_uid();
        g->key = response.group_key();
        if (g->state == GroupState::kForming) g->state = GroupState::kUp;
      }
      for (const auto& [peer, why] : restarts) RunNodeAbort(peer, why);
      return absl::OkStatus();
    }
    if (!s.ok()) {
      const grpc::StatusCode code = s.error_code();
      if (code == grpc::StatusCode::FAILED_PRECONDITION ||
          code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::UNAUTHENTICATED ||
          code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
          code == grpc::StatusCode::PERMISSION_DENIED) {
        return absl::Status(static_cast<absl::StatusCode>(code),
                            absl::StrCat(where, " refused to form it: ", s.error_message()));
      }
      last = s.error_message();
      if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
        failing_since = std::min(failing_since, absl::Now());
        if (absl::Now() - failing_since > down_after) {
          return absl::UnavailableError(
              absl::StrCat(where, " is unreachable (for ",
                           absl::FormatDuration(absl::Now() - failing_since), "): ", last));
        }
      } else {
        failing_since = absl::InfiniteFuture();  // it answered (e.g. it could not call back)
      }
    } else {
      last = "the root has not formed it: its own ranks have not declared it there yet, or "
             "members are missing";
      failing_since = absl::InfiniteFuture();
    }
    {
      absl::MutexLock lock(&mu_);
      if (g->state == GroupState::kFailed) return g->failure;
      if (stopping_) return absl::UnavailableError("hsapd is stopping");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, " has not answered formed ", by, " (", last, ")"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void Cluster::AnswerJoinLocked(const GroupEntry& g, bool nonce_ok,
                               v1::JoinGroupResponse* response) {
  if (g.state != GroupState::kUp || !nonce_ok) return;  // not yet: ask again
  response->set_formed(true);
  response->set_group_uid(g.uid);
  response->set_group_key(g.key);
  for (size_t i = 0; i < g.members.size(); ++i) {
    v1::GroupMember* out = response->add_members();
    out->set_address(g.members[i].address);
    const bool self = static_cast<int32_t>(i) == g.node_index;
    out->set_incarnation(self ? incarnation_ : g.members[i].incarnation);
    const std::string ucx =
        self ? (worker_ != nullptr ? worker_->Address() : "") : g.members[i].ucx_address;
    out->set_ucx_worker_address(ucx);
  }
}

grpc::Status Cluster::OnJoinGroup(const PeerCaller& caller, const v1::JoinGroupRequest& request,
                                  v1::JoinGroupResponse* response) {
  const absl::Status valid = ValidateJoinGroupRequest(request, UcxCheck());
  if (!valid.ok()) return ToGrpcStatus(valid);
  if (absl::Status who = CheckClaim(caller, request.address(),
                                    absl::StrCat("JoinGroup for group '", request.group(), "'"));
      !who.ok()) {
    return ToGrpcStatus(who);
  }
  const std::string sender = absl::StrCat(request.address(), "#", request.incarnation());
  const std::vector<std::string> asked(request.nodes().begin(), request.nodes().end());
  std::shared_ptr<GroupEntry> g;
  int32_t index = -1;
  bool root = false;  // this daemon is the group's root (else a member it was taken for)
  std::string self;
  v1::ConfirmMemberRequest confirm;
  std::shared_ptr<v1::Peer::Stub> stub;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
    self = options_.advertise_address;
    g = groups_.Find(request.group());
    if (g == nullptr) {
      if (request.nodes(0) != self) {
        return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
            "JoinGroup from ", sender, " for group '", request.group(), "' names '",
            request.nodes(0), "' as the group's root (nodes[0]), but this daemon is '", self,
            "' (its --advertise_address): every member must name the root as it advertises "
            "itself")));
      }
      auto refused = refusals_.find(request.group());
      if (refused != refusals_.end() && refused->second.node_index == 0 &&
          IndexIn(refused->second.nodes, request.address()) > 0) {
        return ToGrpcStatus(absl::FailedPreconditionError(
            absl::StrCat("group '", request.group(), "' failed on its root ", self, ": ",
                         refused->second.reason.message())));
      }
      // The root's own ranks have not declared it yet: the member asks again.
      return grpc::Status::OK;
    }
    index = g->IndexOf(request.address());
    root = g->node_index == 0;
    if (!root && (index < 0 || index == g->node_index)) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "JoinGroup from ", sender, " for group '", g->name, "': this daemon (", self,
          ") is node ", g->node_index, " of the group, whose root is '", g->members[0].address,
          "'; the JoinGroup names '", request.nodes(0), "' as the root")));
    }
    if (index <= 0) {
      const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
          "JoinGroup from ", sender, " (", caller.transport, ") for group '", g->name,
          "' refused: '", request.address(), "' is not a member of the group on its root ", self,
          " (members [", absl::StrJoin(g->addresses(), ", "), "]; the request declares [",
          absl::StrJoin(asked, ", "), "])"));
      HSAP_LOG(WARNING) << refused.message();
      return ToGrpcStatus(refused);
    }
    // Below, a member of this daemon's group: at its root the member
    // joins; at another member (it names this daemon as the root) its
    // account can only show that the two declared different groups.
    if (g->state == GroupState::kFailed) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "group '", g->name, "' failed (", g->failure.message(),
          "); form the group again under a new group name")));
    }
    GroupMember& m = g->members[index];
    const bool nonce_ok = !m.nonce.empty() && TokensEqual(request.nonce(), m.nonce);
    if (root && m.joined && nonce_ok && asked == g->addresses() && request.node_index() == index &&
        request.refused_code() == 0 && request.incarnation() == m.incarnation &&
        request.ucx_worker_address() == m.ucx_address) {
      AnswerJoinLocked(*g, true, response);
      return grpc::Status::OK;
    }
    // Anything else needs the member's own word. One call back at a time
    // per member: the others ask again.
    if (m.confirming) return grpc::Status::OK;
    const PeerRecord* p = peers_.Find(m.peer);
    if (p == nullptr || p->stub == nullptr) return ToGrpcStatus(absl::InternalError("member has no stub"));
    if (m.nonce.empty()) m.nonce = NewGroupSecret();
    m.confirming = true;
    stub = p->stub;
    rpc_timeout = options_.rpc_timeout;
    confirm.set_group(g->name);
    confirm.set_root(self);
    confirm.set_root_incarnation(incarnation_);
    confirm.set_nonce(m.nonce);
  }
  grpc::ClientContext context;
  // Through a reconnect backoff (a member that just restarted), not past it.
  context.set_wait_for_ready(true);
  context.set_deadline(absl::ToChronoTime(absl::Now() + std::max(rpc_timeout, absl::Seconds(1))));
  v1::ConfirmMemberResponse view;
  const grpc::Status called = stub->ConfirmMember(&context, confirm, &view);

  absl::Status restart;
  int32_t member_peer = -1;
  {
    absl::MutexLock lock(&mu_);
    if (groups_.Find(request.group()) != g) {
      return ToGrpcStatus(absl::UnavailableError(absl::StrCat(
          "group '", request.group(), "' was released on its root while ", sender,
          " was confirmed")));
    }
    GroupMember& m = g->members[index];
    m.confirming = false;
    if (g->state == GroupState::kFailed) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "group '", g->name, "' failed (", g->failure.message(),
          "); form the group again under a new group name")));
    }
    if (!called.ok()) {
      m.last_error = absl::StrCat("its root could not call it back at its address: ",
                                  called.error_message());
      // ABORTED: the member asks again (its formation times out, naming it).
      return ToGrpcStatus(absl::AbortedError(absl::StrCat(
          "group '", g->name, "': the root ", self, " could not call ", request.address(),
          " back to confirm this JoinGroup (", called.error_message(),
          "); the root must reach every member at its advertised address")));
    }
    if (!view.joining()) {
      const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
          "JoinGroup claiming to be member ", sender, " of group '", g->name, "' refused: ",
          request.address(), ", called back at its address, is not joining the group with "
          "this root (", self, "); the request (from ", caller.transport, ") was not sent by it"));
      HSAP_LOG(WARNING) << refused.message();
      return ToGrpcStatus(refused);
    }
    const std::string member_name = absl::StrCat(request.address(), "#", view.incarnation());
    const std::vector<std::string> theirs(view.nodes().begin(), view.nodes().end());
    const bool forming = g->state == GroupState::kForming;
    const bool conflict = view.refused_code() != 0 || theirs != g->addresses() ||
                          view.node_index() != index;
    if (conflict) {
      // The member's own account contradicts this daemon's group: it fails
      // here for every rank with both sides' words.
      const absl::Status reason = ApplyMemberViewLocked(*g, index, view, &restart, &member_peer);
      // A member that learns it first tells the root, so that every node
      // of the group fails now with the reason, not at its timeout.
      if (!root && forming && reports_.size() < kMaxReports) reports_.push_back(g->name);
      return ToGrpcStatus(reason);
    }
    if (!root) {
      return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
          "JoinGroup from ", sender, " for group '", g->name, "': this daemon (", self,
          ") is node ", g->node_index, " of the group, whose root is '", g->members[0].address,
          "'")));
    }
    if (view.incarnation() != request.incarnation() ||
        view.ucx_worker_address() != request.ucx_worker_address() || asked != g->addresses() ||
        request.node_index() != index || request.refused_code() != 0) {
      const absl::Status refused = absl::PermissionDeniedError(absl::StrCat(
          "JoinGroup claiming to be member ", sender, " of group '", g->name, "' refused: ",
          "the member itself, called back at its address, reports ", member_name,
          view.incarnation() == request.incarnation() ? " with another UCX worker address" : "",
          "; the request (from ", caller.transport, ") was not sent by it"));
      HSAP_LOG(WARNING) << refused.message();
      return ToGrpcStatus(refused);
    }
    const absl::Status joined = ApplyMemberViewLocked(*g, index, view, &restart, &member_peer);
    if (!joined.ok()) return ToGrpcStatus(joined);
    AnswerJoinLocked(*g, !m.nonce.empty() && TokensEqual(request.nonce(), m.nonce), response);
  }
  if (!restart.ok()) RunNodeAbort(member_peer, restart);
  return grpc::Status::OK;
}

absl::Status Cluster::ApplyMemberViewLocked(GroupEntry& g, int32_t index,
                                            const v1::ConfirmMemberResponse& view,
                                            absl::Status* restart, int32_t* member_peer) {
  GroupMember& m = g.members[index];
  const bool root = g.node_index == 0;
  const std::string self = options_.advertise_address;
  const std::string member_name = absl::StrCat(m.address, "#", view.incarnation());
  const std::vector<std::string> theirs(view.nodes().begin(), view.nodes().end());
  if (!view.joining()) {
    m.last_error = "its ranks have not declared the group there";
    return absl::OkStatus();
  }
  if (view.refused_code() != 0 && root) {
    const absl::Status reason = absl::FailedPreconditionError(
        absl::StrCat("group '", g.name, "': member ", member_name, " refused the group: ",
                     view.refused_message().substr(0, kMaxPeerMessageBytes)));
    FailGroupLocked(g, reason);
    return reason;
  }
  if (theirs != g.addresses() || view.node_index() != index) {
    const absl::Status reason = absl::FailedPreconditionError(absl::StrCat(
        "group '", g.name, "': member ", member_name, " declares nodes [",
        absl::StrJoin(theirs, ", "), "] (its node_index ", view.node_index(), "); ",
        root ? "its root " : "its node ", self, " has [", absl::StrJoin(g.addresses(), ", "),
        "] (one group name, one member list)"));
    FailGroupLocked(g, reason);
    return reason;
  }
  if (!root || view.refused_code() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group '", g.name, "': member ", member_name, " is not joining it here"));
  }
  if (m.joined && m.incarnation != view.incarnation()) {
    const absl::Status reason = absl::AbortedError(absl::StrCat(
        "member ", m.address, " restarted (incarnation ", m.incarnation, " -> ",
        view.incarnation(), ") while group '", g.name, "' lived"));
    FailGroupLocked(g, reason);
    return absl::FailedPreconditionError(reason.message());
  }
  if (!m.joined) {
    const absl::Status valid = ValidatePeerUcxAddress(view.ucx_worker_address(), UcxCheck());
    if (!valid.ok()) return valid;
    HSAP_RETURN_IF_ERROR(
        LearnPeerLocked(m.peer, view.incarnation(), view.ucx_worker_address(), restart));
    *member_peer = m.peer;
    m.incarnation = view.incarnation();
    m.ucx_address = view.ucx_worker_address();
    m.joined = true;
    m.last_error.clear();
  } else if (m.ucx_address.empty()) {
    m.ucx_address = view.ucx_worker_address();  // a static peer, joined from the start
  }
  if (g.state == GroupState::kForming && g.Missing().empty()) g.state = GroupState::kUp;
  return absl::OkStatus();
}

void Cluster::ConfirmMissingMembers(const std::shared_ptr<GroupEntry>& g) {
  struct Ask {
    int32_t index;
    std::shared_ptr<v1::Peer::Stub> stub;
    v1::ConfirmMemberRequest request;
  };
  std::vector<Ask> asks;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (g->state != GroupState::kForming) return;
    rpc_timeout = options_.rpc_timeout;
    for (size_t i = 1; i < g->members.size(); ++i) {
      GroupMember& m = g->members[i];
      if (m.joined || m.confirming) continue;
      const PeerRecord* p = peers_.Find(m.peer);
      if (p == nullptr || p->stub == nullptr) continue;
      if (m.nonce.empty()) m.nonce = NewGroupSecret();
      m.confirming = true;
      Ask ask{static_cast<int32_t>(i), p->stub, {}};
      ask.request.set_group(g->name);
      ask.request.set_root(options_.advertise_address);
      ask.request.set_root_incarnation(incarnation_);
      ask.request.set_nonce(m.nonce);
      asks.push_back(std::move(ask));
    }
  }
  for (Ask& ask : asks) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
    v1::ConfirmMemberResponse view;
    const grpc::Status called = ask.stub->ConfirmMember(&context, ask.request, &view);
    absl::Status restart;
    int32_t member_peer = -1;
    {
      absl::MutexLock lock(&mu_);
      GroupMember& m = g->members[ask.index];
      m.confirming = false;
      if (g->state != GroupState::kForming) continue;
      if (!called.ok()) {
        m.last_error = absl::StrCat("unreachable at its address: ", called.error_message());
        continue;
      }
      (void)ApplyMemberViewLocked(*g, ask.index, view, &restart, &member_peer);
    }
    if (!restart.ok()) RunNodeAbort(member_peer, restart);
  }
}

grpc::Status Cluster::OnConfirmMember(const PeerCaller& caller,
                                      const v1::ConfirmMemberRequest& request,
                                      v1::ConfirmMemberResponse* response) {
  absl::Status valid = ValidateCallFields(request.group(), nullptr);
  if (valid.ok()) valid = ValidateNodeAddress("root", request.root());
  if (valid.ok() && (request.nonce().empty() || request.nonce().size() > 64)) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("nonce has ", request.nonce().size(), " bytes; 1 to 64"));
  }
  if (!valid.ok()) return ToGrpcStatus(valid);
  if (absl::Status who = CheckClaim(caller, request.root(), "ConfirmMember"); !who.ok()) {
    return ToGrpcStatus(who);
  }
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
  auto fill = [&](const std::vector<std::string>& nodes, int32_t node_index) {
    response->set_joining(true);
    response->set_incarnation(incarnation_);
    if (worker_ != nullptr) response->set_ucx_worker_address(worker_->Address());
    for (const std::string& n : nodes) response->add_nodes(n);
    response->set_node_index(node_index);
  };
  std::shared_ptr<GroupEntry> g = groups_.Find(request.group());
  // This daemon's account of its group of that name, even when it names
  // its root otherwise (the caller then sees the two lists differ).
  if (g != nullptr && g->node_index > 0) {
    // Whoever called, the nonce is only of use to this daemon's own next
    // JoinGroup to that root (a wrong one is answered with a fresh call back).
    if (g->members[0].address == request.root()) g->join_nonce = request.nonce();
    fill(g->addresses(), g->node_index);
    if (g->state == GroupState::kFailed) {  // it failed here first: the reason
      response->set_refused_code(static_cast<int>(g->failure.code()));
      response->set_refused_message(
          std::string(g->failure.message().substr(0, kMaxPeerMessageBytes)));
    }
    return grpc::Status::OK;
  }
  auto refused = refusals_.find(request.group());
  if (refused != refusals_.end() && refused->second.node_index > 0) {
    fill(refused->second.nodes, refused->second.node_index);
    const absl::Status& why = refused->second.reason;
    response->set_refused_code(why.ok() ? static_cast<int>(absl::StatusCode::kUnknown)
                                        : static_cast<int>(why.code()));
    response->set_refused_message(std::string(why.message().substr(0, kMaxPeerMessageBytes)));
  }
  return grpc::Status::OK;  // joining false: this daemon sent no such JoinGroup
}

void Cluster::RecordRefusalLocked(const std::string& group, const std::vector<std::string>& nodes,
                                  int32_t node_index, const absl::Status& reason, bool report) {
  if (node_index < 0 || node_index >= static_cast<int32_t>(nodes.size()) || nodes.size() < 2) {
    return;
  }
  if (refusals_.size() >= kMaxRefusals && refusals_.count(group) == 0) {
    auto oldest = refusals_.begin();
    for (auto it = refusals_.begin(); it != refusals_.end(); ++it) {
      if (it->second.when < oldest->second.when) oldest = it;
    }
    refusals_.erase(oldest);
  }
  refusals_[group] = Refusal{nodes, node_index, reason, absl::Now()};
  if (report && node_index > 0 && nodes[0] != options_.advertise_address &&
      reports_.size() < kMaxReports) {
    reports_.push_back(group);
  }
}

void Cluster::ReportLoop() {
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !reports_.empty();
  };
  while (true) {
    v1::JoinGroupRequest request;
    std::shared_ptr<v1::Peer::Stub> stub;
    absl::Duration rpc_timeout;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
      const std::string group = reports_.front();
      reports_.erase(reports_.begin());
      Refusal r;
      std::shared_ptr<GroupEntry> g = groups_.Find(group);
      auto refused = refusals_.find(group);
      if (g != nullptr && g->state == GroupState::kFailed && g->node_index > 0) {
        r = Refusal{g->addresses(), g->node_index, g->failure, absl::Now()};
      } else if (refused != refusals_.end()) {
        r = refused->second;
      } else {
        continue;
      }
      request.set_group(group);
      for (const std::string& n : r.nodes) request.add_nodes(n);
      request.set_node_index(r.node_index);
      request.set_address(options_.advertise_address);
      request.set_incarnation(incarnation_);
      if (worker_ != nullptr) request.set_ucx_worker_address(worker_->Address());
      request.set_version(options_.version);
      request.set_refused_code(r.reason.ok() ? static_cast<int>(absl::StatusCode::kUnknown)
                                             : static_cast<int>(r.reason.code()));
      request.set_refused_message(
          std::string(r.reason.message().substr(0, kMaxPeerMessageBytes)));
      stub = MakeStub(r.nodes[0]);
      rpc_timeout = options_.rpc_timeout;
    }
    // Best effort: the root calls back (ConfirmMember) before it believes it.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + 2 * rpc_timeout + absl::Seconds(1)));
    v1::JoinGroupResponse response;
    const grpc::Status s = stub->JoinGroup(&context, request, &response);
    HSAP_LOG(INFO) << "told the root " << request.nodes(0) << " that this node refused group '"
                   << request.group() << "': " << (s.ok() ? "OK" : s.error_message());
  }
}

}  // namespace hsap::cluster

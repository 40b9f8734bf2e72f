// Cluster: the measured cost profile of a group (GroupProfile, its RPC, the
// link probes). See cluster.h and docs/cost_model.md, "Measured profiles".
#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/cluster/cluster.h"
#include "server/grpc/status_util.h"
#include "server/plan/plan_proto.h"

namespace hsap::cluster {
namespace {

std::pair<int, int32_t> KeyOf(DType dtype, int32_t head_dim) {
  return {static_cast<int>(dtype), head_dim};
}

// A root's answer must be a parametric profile the planner accepts.
absl::Status CheckRootProfile(const std::string& profile, const std::string& root) {
  if (profile.size() > 1024 || !absl::StartsWith(profile, plan::kCustomProfilePrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the group's root ", root, " answered GroupProfile with '",
                     profile.substr(0, 80), "' (", profile.size(),
                     " bytes), not a parametric profile of at most 1024 bytes"));
  }
  const absl::StatusOr<plan::HardwareProfile> parsed = plan::ParseHardwareProfile(profile);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the group's root ", root,
                                                   " answered GroupProfile with a bad profile: ",
                                                   parsed.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace

void Cluster::SetLocalProfile(LocalProfileFn local) { local_profile_ = std::move(local); }

Cluster::ProfileTable* Cluster::ProfilesLocked(const std::string& group, bool declared) const {
  if (!declared) return &static_profiles_;
  std::shared_ptr<GroupEntry> g = groups_.Find(group);
  return g == nullptr ? nullptr : &g->profiles;  // the table keeps the entry alive
}

std::optional<std::string> Cluster::KnownGroupProfile(const std::string& group, bool declared,
                                                      DType dtype, int32_t head_dim) const {
  absl::MutexLock lock(&mu_);
  const ProfileTable* profiles = ProfilesLocked(group, declared);
  if (profiles == nullptr) return std::nullopt;
  auto it = profiles->find(KeyOf(dtype, head_dim));
  if (it == profiles->end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> Cluster::StaticProfiles() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [key, p] : static_profiles_) {
    out.push_back(
        absl::StrCat(DTypeName(static_cast<DType>(key.first)), "/d", key.second, " ", p));
  }
  return out;
}

absl::StatusOr<std::string> Cluster::GroupProfile(const std::string& group, bool declared,
                                                  DType dtype, int32_t head_dim,
                                                  absl::Time deadline) {
  if (std::optional<std::string> known = KnownGroupProfile(group, declared, dtype, head_dim)) {
    return *known;
  }
  std::shared_ptr<v1::Peer::Stub> stub;
  std::string root_name;
  v1::GroupProfileRequest request;
  absl::Duration down_after;
  bool root = false;
  {
    absl::MutexLock lock(&mu_);
    if (!started_) return absl::FailedPreconditionError("the peer layer has not started");
    if (declared) {
      std::shared_ptr<GroupEntry> g = groups_.Find(group);
      if (g == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("group '", group, "' is not known here (released while its call ran?)"));
      }
      if (g->state == GroupState::kFailed) return g->failure;
      root = g->node_index == 0;
      if (!root) {
        const PeerRecord* p = peers_.Find(g->members[0].peer);
        if (p == nullptr) return absl::InternalError("the group's root is not a peer here");
        stub = p->stub;
        root_name = p->address;
      }
    } else {
      if (num_static_ <= 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", group, "' declares no nodes and there is no static cluster"));
      }
      root = self_ == 0;
      if (!root) {
        stub = StaticPeer(0).stub;
        root_name = absl::StrCat("node 0 (", StaticPeer(0).address, ")");
      }
    }
    request.set_node_rank(self_);
    request.set_address(options_.advertise_address);
    if (declared) request.set_group_key(GroupKeyLocked(group));
    down_after = options_.down_after;
  }
  if (root) return RootGroupProfile(group, declared, dtype, head_dim, deadline);
  if (stub == nullptr) return absl::InternalError("the group's root has no stub");
  request.set_group(group);
  request.set_declared(declared);
  request.set_dtype(plan::DTypeToProto(dtype));
  request.set_head_dim(head_dim);
  request.set_incarnation(incarnation_);
  std::string last = "no answer yet";
  absl::Time failing_since = absl::InfiniteFuture();
  while (true) {
    grpc::ClientContext context;
    // The root may probe every member first: a generous bound, but one, so
    // that a hung root is noticed between attempts.
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(60))));
    v1::GroupProfileResponse response;
    const grpc::Status s = stub->GroupProfile(&context, request, &response);
    if (s.ok() && response.ready()) {
      HSAP_RETURN_IF_ERROR(CheckRootProfile(response.profile(), root_name));
      absl::MutexLock lock(&mu_);
      ProfileTable* profiles = ProfilesLocked(group, declared);
      if (profiles == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("group '", group, "' was released while its profile was settled"));
      }
      if (profiles->size() >= kMaxGroupProfiles && profiles->count(KeyOf(dtype, head_dim)) == 0) {
        return absl::ResourceExhaustedError(
            absl::StrCat("group '", group, "' has plans of ", profiles->size(),
                         " (dtype, head_dim) profiles; at most ", kMaxGroupProfiles));
      }
      return profiles->emplace(KeyOf(dtype, head_dim), response.profile()).first->second;
    }
    if (!s.ok()) {
      const grpc::StatusCode code = s.error_code();
      if (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::Status(static_cast<absl::StatusCode>(code),
                            absl::StrCat("group '", group, "': its root ", root_name,
                                         " refused its profile: ", s.error_message()));
      }
      last = s.error_message();
      failing_since = std::min(failing_since, absl::Now());
      if (absl::Now() - failing_since > down_after) {
        return absl::UnavailableError(absl::StrCat("group '", group, "': its root ", root_name,
                                                   " did not give its profile: ", last));
      }
    } else {
      last = "the root's ranks have not arrived";
      failing_since = absl::InfiniteFuture();
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("hsapd is stopping");
      if (declared) {
        std::shared_ptr<GroupEntry> g = groups_.Find(group);
        if (g != nullptr && g->state == GroupState::kFailed) return g->failure;
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "group '", group, "': its root ", root_name, " gave no profile by the call's deadline (",
          last, ")"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::string> Cluster::RootGroupProfile(const std::string& group, bool declared,
                                                      DType dtype, int32_t head_dim,
                                                      absl::Time deadline) {
  const auto key = KeyOf(dtype, head_dim);
  std::vector<int32_t> members;
  {
    absl::MutexLock lock(&mu_);
    const std::map<std::pair<int, int32_t>, std::string>* profiles = &static_profiles_;
    std::shared_ptr<GroupEntry> g;
    if (declared) {
      g = groups_.Find(group);
      if (g == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("group '", group, "' is not known here (released while its call ran?)"));
      }
      if (g->state == GroupState::kFailed) return g->failure;
      profiles = &g->profiles;
      for (size_t i = 0; i < g->members.size(); ++i) {
        if (static_cast<int32_t>(i) != g->node_index) members.push_back(g->members[i].peer);
      }
    } else {
      for (int32_t id = 0; id < num_static_; ++id) {
        if (id != self_) members.push_back(id);
      }
    }
    auto it = profiles->find(key);
    if (it != profiles->end()) return it->second;
    if (profiles->size() >= kMaxGroupProfiles) {
      return absl::ResourceExhaustedError(
          absl::StrCat("group '", group, "' has plans of ", profiles->size(),
                       " (dtype, head_dim) profiles; at most ", kMaxGroupProfiles));
    }
  }
  if (!local_profile_) {
    return absl::FailedPreconditionError("this daemon measures no profile (no local profile set)");
  }
  HSAP_ASSIGN_OR_RETURN(plan::HardwareProfile profile, local_profile_(dtype, head_dim));
  double bytes_per_s = std::numeric_limits<double>::infinity(), latency_s = 0;
  for (int32_t peer : members) {
    HSAP_ASSIGN_OR_RETURN(LinkFigures link, PeerLink(peer, deadline));
    bytes_per_s = std::min(bytes_per_s, link.bytes_per_s);
    latency_s = std::max(latency_s, link.latency_s);
  }
  if (!members.empty()) {
    profile.inter_bytes_per_s = bytes_per_s;
    profile.inter_latency_s = latency_s;
  }
  const std::string settled = plan::CustomProfileString(profile);
  absl::MutexLock lock(&mu_);
  ProfileTable* profiles = ProfilesLocked(group, declared);
  if (profiles == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("group '", group, "' was released while its profile was settled"));
  }
  // Another rank thread or member may have settled it meanwhile: the first wins.
  return profiles->emplace(key, settled).first->second;
}

absl::StatusOr<LinkFigures> Cluster::PeerLink(int32_t peer, absl::Time deadline) {
  absl::MutexLock probing(&probe_mu_);
  std::shared_ptr<v1::Peer::Stub> stub;
  uint64_t incarnation = 0;
  std::string name;
  absl::Duration rpc_timeout;
  {
    absl::MutexLock lock(&mu_);
    const PeerRecord* p = peers_.Find(peer);
    if (p == nullptr || p->stub == nullptr) {
      return absl::UnavailableError(absl::StrCat("peer ", peer, " is not known here"));
    }
    if (p->link.incarnation != 0 && p->link.incarnation == p->incarnation) return p->link;
    stub = p->stub;
    incarnation = p->incarnation;
    name = p->pinned ? absl::StrCat("node ", p->id, " (", p->address, ")") : p->address;
    rpc_timeout = options_.rpc_timeout;
  }
  std::map<int64_t, v1::ProbeLinkRequest> requests;
  ProbeCall call = [&](int64_t bytes, absl::Time until) -> absl::Status {
    v1::ProbeLinkRequest& request = requests[bytes];
    if (static_cast<int64_t>(request.payload().size()) != bytes) {
      request.mutable_payload()->assign(static_cast<size_t>(bytes), 'p');
    }
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(
          std::min(until, absl::Now() + std::max(rpc_timeout, absl::Seconds(10)))));
      v1::ProbeLinkResponse response;
      const grpc::Status s = stub->ProbeLink(&context, request, &response);
      if (s.ok()) return absl::OkStatus();
      const absl::Status failed(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() >= until) return failed;
      // A channel that lost its peer a moment ago (a restart) is in gRPC's
      // reconnect backoff and fails at once: try again while the peer is
      // the one being measured and not DOWN (a lost node ends the probe,
      // as it ends the calls in flight).
      {
        absl::MutexLock lock(&mu_);
        const PeerRecord* p = peers_.Find(peer);
        if (p == nullptr || p->state == NodeState::kDown || p->incarnation != incarnation) {
          return absl::UnavailableError(
              absl::StrCat(name, " was lost during the link probe: ", s.error_message()));
        }
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  };
  HSAP_ASSIGN_OR_RETURN(LinkFigures link, MeasureLink(call, name, deadline));
  link.incarnation = incarnation;
  HSAP_LOG(INFO) << "link to " << name << " measured: " << link.bytes_per_s << " B/s, "
                 << link.latency_s * 1e6 << " us";
  absl::MutexLock lock(&mu_);
  PeerRecord* p = peers_.Find(peer);
  if (p != nullptr && p->incarnation == incarnation) p->link = link;
  return link;
}

grpc::Status Cluster::OnProbeLink(const PeerCaller&) {
  // Before Start the caller was not authorized (AuthorizePeerCall lets it
  // through for the handlers to answer UNAVAILABLE): found by
  // link_probe_fuzzer, which saw OK here.
  absl::MutexLock lock(&mu_);
  if (!started_ || stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not started");
  return grpc::Status::OK;
}

grpc::Status Cluster::OnGroupProfile(const PeerCaller& caller,
                                     const v1::GroupProfileRequest& request, absl::Time deadline,
                                     v1::GroupProfileResponse* response) {
  if (request.head_dim() < 1 || request.head_dim() > 4096) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("head_dim is ", request.head_dim(), "; it must be in [1, 4096]")));
  }
  const absl::StatusOr<DType> dtype = plan::DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return ToGrpcStatus(dtype.status());
  absl::StatusOr<int32_t> sender = SenderPeer(request.node_rank(), request.address(),
                                              request.incarnation(), request.group());
  if (!sender.ok() && !absl::IsNotFound(sender.status())) return ToGrpcStatus(sender.status());
  if (absl::Status who = CheckClaim(caller, ClaimedAddress(request.node_rank(), request.address()),
                                    "GroupProfile");
      !who.ok()) {
    return ToGrpcStatus(who);
  }
  const std::string name = SenderName(request.node_rank(), request.address(), request.incarnation());
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "hsapd is stopping");
    if (request.declared()) {
      std::shared_ptr<GroupEntry> g = groups_.Find(request.group());
      // Its ranks have not arrived here yet: ask again.
      if (g == nullptr) return grpc::Status::OK;
      if (g->node_index != 0) {
        return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
            "this daemon is node ", g->node_index, " of group '", g->name, "', not its root")));
      }
      if (g->state == GroupState::kFailed) {
        return ToGrpcStatus(absl::FailedPreconditionError(
            absl::StrCat("group '", g->name, "' failed (", g->failure.message(), ")")));
      }
      bool not_formed = false;
      const absl::Status may =
          CheckCallSenderLocked("GroupProfile", request.group(), sender.ok() ? *sender : -1, name,
                                request.incarnation(), request.group_key(), &not_formed);
      if (!may.ok()) return ToGrpcStatus(may);
      if (not_formed) return grpc::Status::OK;  // still forming
    } else if (!sender.ok() || self_ != 0 || num_static_ <= 1 || *sender >= num_static_) {
      return ToGrpcStatus(absl::FailedPreconditionError(
          "GroupProfile of an undeclared group goes to node 0 of a static cluster, from one of "
          "its nodes"));
    }
  }
  const absl::StatusOr<std::string> profile =
      RootGroupProfile(request.group(), request.declared(), *dtype, request.head_dim(),
                       std::min(deadline, absl::Now() + absl::Seconds(60)));
  if (!profile.ok()) return ToGrpcStatus(profile.status());
  response->set_ready(true);
  response->set_profile(*profile);
  return grpc::Status::OK;
}

}  // namespace hsap::cluster

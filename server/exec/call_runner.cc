#include "server/exec/call_runner.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/exec/call_plan.h"
#include "server/plan/cost_model.h"
#include "server/plan/plan_key.h"
#include "server/transport/inprocess_transport.h"
#include "server/transport/ucx_transport.h"

namespace hsap {
namespace {

// The transport endpoints of one call's local ranks.
struct CallTransports : GroupResources {
  // Multi-node calls: tells the cluster this node is done with the call,
  // then (members, in reverse order) closes the endpoints and frees the
  // receive comm id.
  ~CallTransports() override {
    if (cluster != nullptr) cluster->EndCall(group, call_seq);
    if (peers_cluster != nullptr) peers_cluster->ReleaseCallPeers(nodes);
  }

  std::unique_ptr<transport::InProcessFabric> fabric;                // one-node groups
  // Multi-node calls: the id this node receives the call on (comm_ids.h),
  // held until the last local rank is done with the call.
  transport::CommIdAllocator::Lease recv_comm;
  std::vector<std::unique_ptr<transport::UcxTransport>> ucx;          // by local index
  int32_t first_local_rank = 0;
  // The group's member nodes, by peer id in group node order (its failure
  // domain).
  std::vector<int32_t> nodes;
  absl::Status setup;  // why the transports could not be made, if so
  cluster::Cluster* cluster = nullptr;  // multi-node calls
  // Set when `nodes` hold one reference each for this call
  // (Cluster::AcquireGroup), given back at the end.
  cluster::Cluster* peers_cluster = nullptr;
  bool declared = false;  // a group declared by call.nodes (formed at run time)
  std::string group;
  uint64_t call_seq = 0;

  transport::UcxTransport* ucx_endpoint(int32_t rank) {
    const int32_t i = rank - first_local_rank;
    return i >= 0 && i < static_cast<int32_t>(ucx.size()) ? ucx[i].get() : nullptr;
  }
  transport::Transport* endpoint(int32_t rank) {
    if (fabric != nullptr) return fabric->endpoint(rank);
    return ucx_endpoint(rank);
  }
  void Abort(const absl::Status& reason) {
    if (fabric != nullptr) fabric->AbortAll(reason);
    for (auto& t : ucx) t->Abort(reason);
  }
};

std::string CallName(const std::string& group, uint64_t call_seq) {
  return absl::StrCat(group, "/", call_seq);
}

// Registers a call's transports in ActiveCalls for the scope of its run.
}  // namespace

class ActiveCallScope {
 public:
  ActiveCallScope(ActiveCalls* active, const std::string& name,
                  std::shared_ptr<GroupResources> resources)
      : active_(active), name_(name) {
    absl::MutexLock lock(&active_->mu_);
    active_->calls_[name_] = std::move(resources);
  }
  ~ActiveCallScope() {
    absl::MutexLock lock(&active_->mu_);
    active_->calls_.erase(name_);
  }

 private:
  ActiveCalls* active_;
  std::string name_;
};

void ActiveCalls::AbortAll(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, r] : calls_) static_cast<CallTransports*>(r.get())->Abort(reason);
}

int ActiveCalls::AbortWithNode(int32_t node, const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  int aborted = 0;
  for (auto& [name, r] : calls_) {
    auto* t = static_cast<CallTransports*>(r.get());
    if (std::find(t->nodes.begin(), t->nodes.end(), node) == t->nodes.end()) continue;
    t->Abort(reason);
    ++aborted;
  }
  return aborted;
}

void ActiveCalls::Abort(const std::string& group, uint64_t call_seq, const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(CallName(group, call_seq));
  if (it != calls_.end()) static_cast<CallTransports*>(it->second.get())->Abort(reason);
}

CallMatcher::ResourceFactory CallResources(const CallRunnerOptions& options) {
  return [options](const CallArrival& a) {
    auto r = std::make_shared<CallTransports>();
    const int32_t group_size = a.group_size;
    const int32_t num_nodes = static_cast<int32_t>(
        a.members.size() > 1 ? a.members.size() : a.member_nodes.size());
    r->nodes = a.member_nodes;
    if (num_nodes < 1 || group_size % num_nodes != 0 || a.local_ranks.empty()) {
      r->setup = absl::InternalError(absl::StrCat("call ", a.call_seq, " of group '", a.group,
                                                  "' has ", num_nodes, " member node(s) and ",
                                                  a.local_ranks.size(), " local rank(s)"));
    } else if (num_nodes == 1) {
      auto fabric = transport::InProcessFabric::Create(group_size, group_size);
      if (fabric.ok()) {
        r->fabric = std::move(fabric).value();
      } else {
        r->setup = fabric.status();
      }
    } else if (options.ucx == nullptr || options.comm_ids == nullptr ||
               options.cluster == nullptr) {
      r->setup = absl::FailedPreconditionError(
          "the group spans several nodes but this daemon has no UCX data plane (--port 0)");
    } else {
      if (a.members.size() > 1) {
        // Declared by its members: its peers by address (the group's entry
        // and one reference each for this call).
        const int32_t rpn = group_size / num_nodes;
        auto peers =
            options.cluster->AcquireGroup(a.group, a.members, a.local_ranks.front() / rpn, rpn);
        if (!peers.ok()) {
          r->setup = peers.status();
          return r;
        }
        r->nodes = std::move(peers).value();
        r->peers_cluster = options.cluster;
        r->declared = true;
      }
      // This node's receive id, unique among the calls alive on its worker
      // and fresh per call (a failed call's strays cannot match the next
      // call's receives); the other nodes learn it in the plan agreement,
      // and the sends get their ids from there (SetSendComms in Run).
      auto recv_comm = options.comm_ids->Allocate();
      if (!recv_comm.ok()) {
        r->setup = recv_comm.status();
        return r;
      }
      r->recv_comm = std::move(recv_comm).value();
      r->cluster = options.cluster;
      r->group = a.group;
      r->call_seq = a.call_seq;
      transport::UcxTransportOptions o;
      o.recv_comm_id = r->recv_comm.id();
      // Rank r is on group node r / rpn, whose UCX endpoint is its peer's.
      const int32_t rpn = group_size / num_nodes;
      for (int32_t rank = 0; rank < group_size; ++rank) o.node_of_rank.push_back(rank / rpn);
      o.endpoint_of_node = r->nodes;
      r->first_local_rank = a.local_ranks.front();
      for (int32_t rank : a.local_ranks) {
        if (!r->setup.ok()) break;
        o.rank = rank;
        auto t = transport::UcxTransport::Create(options.ucx, o);
        if (t.ok()) {
          r->ucx.push_back(std::move(t).value());
        } else {
          r->setup = t.status();
        }
      }
    }
    return r;
  };
}

namespace {

// The key the member nodes agree on: the plan and the member list (nodes
// that disagree on the members run different groups under one name: their
// addresses, or the static indices of the old rule), the list hashed when
// it would not fit a peer request's key.
std::string NodeAgreementKey(const std::string& plan_key, const std::vector<std::string>& addresses,
                             const std::vector<int32_t>& members) {
  std::string list =
      addresses.empty() ? absl::StrJoin(members, ",") : absl::StrJoin(addresses, ",");
  if (plan_key.size() + list.size() + 7 > 256) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : list) h = (h ^ c) * 1099511628211ull;
    list = absl::StrCat("#", absl::Hex(h, absl::kZeroPad16));
  }
  return absl::StrCat(plan_key, "/nodes=", list);
}

}  // namespace

absl::Status CallRunner::Run(const AttentionCall& call, CallOutcome* outcome) {
  const CallRunnerOptions& options = options_;
  auto layout =
      LayoutForCall(call, options.num_nodes, options.devices_per_node, options.node_rank);
  if (!layout.ok()) return layout.status();
  const plan::Topology* topology = &layout->topology;
  const bool multi_node = topology->num_nodes > 1;
  // The profile to plan with. Under "measured" a multi-node group's is
  // settled by its root after the group formed: until then (the group's
  // first call) the call is checked against a plan of this node's own
  // profile, and its local ranks match on a key without the profile.
  const bool measured = options.profile == plan::kMeasuredProfile;
  std::string profile = options.profile;
  if (measured) {
    if (options.measured == nullptr) return absl::InternalError("no measured profiles");
    std::optional<std::string> group_profile;
    if (multi_node && options.cluster != nullptr) {
      group_profile = options.cluster->KnownGroupProfile(call.group, call.member_addresses.size() > 1,
                                                         call.shape.dtype, call.shape.head_dim);
    }
    if (group_profile.has_value()) {
      profile = *std::move(group_profile);
    } else if (call.group_size == 1) {
      // One rank moves nothing and has nothing to choose between: no
      // measurement (it would run on slots that other calls may be using,
      // and hold this call behind them).
      profile = std::string(plan::kOneRankProfile);
    } else {
      // The caller's cancellation reaches the measurement; its deadline
      // does not (the call's budget starts after planning): a measurement
      // cut by each first call's short deadline, and not kept, would never
      // finish (ASan multirank_test: a 400 ms call stopped it every time).
      exec::StopCheck stop;
      stop.cancelled = call.cancelled;
      auto local =
          options.measured->LocalProfile(call.shape.dtype, call.shape.head_dim, &stop);
      if (!local.ok()) return local.status();
      profile = *std::move(local);
    }
  }
  auto plan = PlanForCall(call, *topology, profile, plans_, &outcome->plan_cache_hit);
  if (!plan.ok()) return plan.status();
  outcome->plan_key = (*plan)->key.ToHex();
  outcome->strategy = static_cast<int>((*plan)->strategy);

  CallArrival arrival;
  arrival.session = call.session;  // group state is scoped to sessions
  arrival.group = call.group;
  arrival.group_size = call.group_size;
  arrival.rank = call.rank;
  arrival.call_seq = call.call_seq;
  const int32_t first = layout->first_local_rank();
  const int32_t local = topology->devices_per_node;
  for (int32_t r = first; r < first + local; ++r) arrival.local_ranks.push_back(r);
  const std::string local_key =
      measured && multi_node
          ? plan::ComputePlanKey(SpecForCall(call, *topology, std::string(plan::kMeasuredProfile)),
                                 plan::kPlanFormatVersion)
                .ToHex()
          : outcome->plan_key;
  arrival.agreement_key = absl::StrCat(local_key, call.backward ? "/bwd" : "/fwd");
  arrival.members = call.member_addresses;
  arrival.member_nodes = layout->member_nodes;
  arrival.cancelled = call.cancelled;
  const absl::Duration budget =
      call.deadline_ms > 0 ? absl::Milliseconds(call.deadline_ms) : options.default_deadline;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + budget;
  auto matched = matcher_->Arrive(arrival, deadline);
  if (!matched.ok()) return matched.status();
  auto resources = std::static_pointer_cast<CallTransports>((*matched)->resources);
  if (resources == nullptr) return absl::InternalError("the call has no transports");
  if (!resources->setup.ok()) return resources->setup;
  if (multi_node && options.cluster == nullptr) {
    return absl::FailedPreconditionError("the group spans several nodes but no cluster is set");
  }
  if (resources->declared) {
    // The group's first call here forms it (JoinGroup with its root); the
    // later ones find it UP, or FAILED.
    absl::Status formed = options.cluster->FormGroup(call.group, deadline);
    if (!formed.ok()) {
      resources->Abort(formed);
      return formed;
    }
  }
  if (measured && multi_node) {
    auto group_profile = options.cluster->GroupProfile(call.group, resources->declared,
                                                       call.shape.dtype, call.shape.head_dim,
                                                       deadline);
    if (group_profile.ok() && *group_profile != profile) {
      plan = PlanForCall(call, *topology, *group_profile, plans_, &outcome->plan_cache_hit);
      if (plan.ok()) {
        outcome->plan_key = (*plan)->key.ToHex();
        outcome->strategy = static_cast<int>((*plan)->strategy);
      }
    }
    const absl::Status settled = !group_profile.ok() ? group_profile.status() : plan.status();
    if (!settled.ok()) {
      resources->Abort(settled);
      return settled;
    }
  }
  ActiveCallScope scope(active_, CallName(call.group, call.call_seq), resources);
  if (multi_node) {
    auto recv_comm_of_node = options.cluster->AgreePlan(
        {call.group, call.call_seq, call.backward},
        NodeAgreementKey(outcome->plan_key, call.member_addresses, layout->member_nodes),
        resources->recv_comm.id(), deadline, resources->nodes);
    absl::Status agreed = recv_comm_of_node.status();
    transport::UcxTransport* ucx = resources->ucx_endpoint(call.rank);
    if (agreed.ok() && ucx == nullptr) {
      agreed = absl::InternalError(absl::StrCat("no UCX endpoint for rank ", call.rank));
    }
    // Each local rank's transport sends with the receiving nodes' ids.
    if (agreed.ok()) agreed = ucx->SetSendComms(std::move(recv_comm_of_node).value());
    if (!agreed.ok()) {
      resources->Abort(agreed);
      return agreed;
    }
  }
  outcome->wait_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  transport::Transport* t = resources->endpoint(call.rank);
  if (t == nullptr) return absl::InternalError(absl::StrCat("no endpoint for rank ", call.rank));

  exec::RankBuffers b;
  b.q = call.q.data;
  b.k = call.k.data;
  b.v = call.v.data;
  b.o = call.o.data;
  b.lse = reinterpret_cast<float*>(call.lse.data);
  if (call.backward) {
    b.d_o = call.d_o.data;
    b.dq = call.dq.data;
    b.dk = call.dk.data;
    b.dv = call.dv.data;
  }
  // Transports are fresh per call, so the call tag only has to keep stages
  // apart; the low 40 bits of call_seq keep it in ExchangeTag's range.
  const uint64_t tag = call.call_seq & ((uint64_t{1} << 40) - 1);
  exec::DeviceSlots::Lease lease = slots_->Acquire(call.rank - first, local);
  outcome->slot = lease.slot();
  absl::Status st = call.backward
                        ? exec::RunBackward(**plan, call.rank, call.shape, b, t, lease.backend(),
                                            deadline, tag, &outcome->exec, call.cancelled)
                        : exec::RunForward(**plan, call.rank, call.shape, b, t, lease.backend(),
                                           deadline, tag, &outcome->exec, call.cancelled);
  slots_->RecordBusy(lease.slot(), outcome->exec.compute_seconds);
  if (!st.ok()) {
    // Take the call down everywhere at once rather than at the deadline.
    resources->Abort(st);
    if (multi_node) options.cluster->AbortCall(call.group, call.call_seq, st, resources->nodes);
  }
  return st;
}

}  // namespace hsap

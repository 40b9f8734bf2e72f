#include "server/exec/call_runner.h"

#include "absl/strings/str_cat.h"
#include "server/exec/call_plan.h"
#include "server/transport/inprocess_transport.h"
#include "server/transport/ucx_transport.h"

namespace hsap {
namespace {

// The transport endpoints of one call's local ranks.
struct CallTransports : GroupResources {
  std::unique_ptr<transport::InProcessFabric> fabric;                // one-node groups
  std::vector<std::unique_ptr<transport::UcxTransport>> ucx;          // by local index
  int32_t first_local_rank = 0;
  absl::Status setup;  // why the transports could not be made, if so

  transport::Transport* endpoint(int32_t rank) {
    if (fabric != nullptr) return fabric->endpoint(rank);
    const int32_t i = rank - first_local_rank;
    return i >= 0 && i < static_cast<int32_t>(ucx.size()) ? ucx[i].get() : nullptr;
  }
  void Abort(const absl::Status& reason) {
    if (fabric != nullptr) fabric->AbortAll(reason);
    for (auto& t : ucx) t->Abort(reason);
  }
};

// FNV-1a over the group name and call_seq: the same on every node (unlike
// absl::Hash, which is seeded per process).
uint32_t StableCommId(const std::string& group, uint64_t call_seq) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint8_t byte) { h = (h ^ byte) * 1099511628211ull; };
  for (char c : group) mix(static_cast<uint8_t>(c));
  for (int i = 0; i < 8; ++i) mix(static_cast<uint8_t>(call_seq >> (8 * i)));
  return static_cast<uint32_t>(h % 1024);
}

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

void ActiveCalls::Abort(const std::string& group, uint64_t call_seq, const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(CallName(group, call_seq));
  if (it != calls_.end()) static_cast<CallTransports*>(it->second.get())->Abort(reason);
}

CallMatcher::ResourceFactory CallResources(const CallRunnerOptions& options) {
  return [options](const std::string& group, int32_t group_size, uint64_t call_seq) {
    auto r = std::make_shared<CallTransports>();
    auto topology = GroupTopology(group_size, options.num_nodes, options.devices_per_node);
    if (!topology.ok()) {
      r->setup = topology.status();
    } else if (topology->num_nodes == 1) {
      auto fabric = transport::InProcessFabric::Create(group_size, group_size);
      if (fabric.ok()) {
        r->fabric = std::move(fabric).value();
      } else {
        r->setup = fabric.status();
      }
    } else if (options.ucx == nullptr) {
      r->setup = absl::FailedPreconditionError(
          "the group spans several nodes but this daemon has no UCX data plane (--peers)");
    } else {
      // Equal on every node and different for consecutive calls of a group,
      // so a failed call's stray messages can never match the next call's.
      transport::UcxTransportOptions o;
      o.comm_id = StableCommId(group, call_seq);
      for (int32_t rank = 0; rank < group_size; ++rank) {
        o.node_of_rank.push_back(rank / options.devices_per_node);
      }
      r->first_local_rank = options.node_rank * options.devices_per_node;
      for (int32_t i = 0; i < options.devices_per_node && r->setup.ok(); ++i) {
        o.rank = r->first_local_rank + i;
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

absl::Status CallRunner::Run(const AttentionCall& call, CallOutcome* outcome) {
  const CallRunnerOptions& options = options_;
  auto topology = GroupTopology(call.group_size, options.num_nodes, options.devices_per_node);
  if (!topology.ok()) return topology.status();
  const bool multi_node = topology->num_nodes > 1;
  if (multi_node && call.rank / options.devices_per_node != options.node_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "call.rank is ", call.rank, " but this node (", options.node_rank, ") serves ranks [",
        options.node_rank * options.devices_per_node, ", ",
        (options.node_rank + 1) * options.devices_per_node, ") of a ", call.group_size,
        "-rank group"));
  }
  auto plan = PlanForCall(call, *topology, options.profile, plans_, &outcome->plan_cache_hit);
  if (!plan.ok()) return plan.status();
  outcome->plan_key = (*plan)->key.ToHex();
  outcome->strategy = static_cast<int>((*plan)->strategy);

  CallArrival arrival;
  arrival.session = call.session;  // group state is scoped to sessions
  arrival.group = call.group;
  arrival.group_size = call.group_size;
  arrival.rank = call.rank;
  arrival.call_seq = call.call_seq;
  const int32_t first = multi_node ? options.node_rank * options.devices_per_node : 0;
  const int32_t local = multi_node ? options.devices_per_node : call.group_size;
  for (int32_t r = first; r < first + local; ++r) arrival.local_ranks.push_back(r);
  arrival.agreement_key = absl::StrCat(outcome->plan_key, call.backward ? "/bwd" : "/fwd");
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
  ActiveCallScope scope(active_, CallName(call.group, call.call_seq), resources);
  if (multi_node) {
    if (options.cluster == nullptr) {
      return absl::FailedPreconditionError("the group spans several nodes but no cluster is set");
    }
    absl::Status agreed =
        options.cluster->AgreePlan({call.group, call.call_seq, call.backward}, outcome->plan_key,
                                   deadline);
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
    if (multi_node) options.cluster->AbortCall(call.group, call.call_seq, st);
  }
  return st;
}

}  // namespace hsap

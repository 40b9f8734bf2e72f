#include "server/exec/call_runner.h"

#include "absl/strings/str_cat.h"
#include "server/exec/call_plan.h"
#include "server/transport/inprocess_transport.h"

namespace hsap {
namespace {

struct InProcessCall : GroupResources {
  std::unique_ptr<transport::InProcessFabric> fabric;
};

}  // namespace

CallMatcher::ResourceFactory InProcessResources(int32_t devices_per_node) {
  return [devices_per_node](const std::string&, int32_t group_size) {
    auto r = std::make_shared<InProcessCall>();
    const int32_t per_node = group_size % devices_per_node == 0 ? devices_per_node : group_size;
    auto fabric = transport::InProcessFabric::Create(group_size, per_node);
    if (fabric.ok()) r->fabric = std::move(fabric).value();
    return r;
  };
}

absl::Status RunCall(const AttentionCall& call, const CallRunnerOptions& options,
                     plan::PlanCache* plans, CallMatcher* matcher,
                     kernels::cpu::ThreadPool* pool, CallOutcome* outcome) {
  auto topology = GroupTopology(call.group_size, options.num_nodes, options.devices_per_node);
  if (!topology.ok()) return topology.status();
  if (topology->num_nodes > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "call.group_size ", call.group_size, " spans ", topology->num_nodes,
        " nodes; this daemon runs groups within one node"));
  }
  auto plan = PlanForCall(call, *topology, options.profile, plans, &outcome->plan_cache_hit);
  if (!plan.ok()) return plan.status();
  outcome->plan_key = (*plan)->key.ToHex();
  outcome->strategy = static_cast<int>((*plan)->strategy);

  CallArrival arrival;
  arrival.group = call.group;
  arrival.group_size = call.group_size;
  arrival.rank = call.rank;
  arrival.call_seq = call.call_seq;
  for (int32_t r = 0; r < call.group_size; ++r) arrival.local_ranks.push_back(r);
  arrival.agreement_key = absl::StrCat(outcome->plan_key, call.backward ? "/bwd" : "/fwd");
  const absl::Duration budget =
      call.deadline_ms > 0 ? absl::Milliseconds(call.deadline_ms) : options.default_deadline;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + budget;
  auto matched = matcher->Arrive(arrival, deadline);
  outcome->wait_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!matched.ok()) return matched.status();
  auto* resources = dynamic_cast<InProcessCall*>((*matched)->resources.get());
  if (resources == nullptr || resources->fabric == nullptr) {
    return absl::InternalError("the call has no transport");
  }
  transport::Transport* t = resources->fabric->endpoint(call.rank);

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
  // Calls of one group use fresh fabrics, so the call tag only has to keep
  // stages apart; the low 40 bits of call_seq keep it in ExchangeTag's range.
  const uint64_t tag = call.call_seq & ((uint64_t{1} << 40) - 1);
  absl::Status st = call.backward
                        ? exec::RunBackward(**plan, call.rank, call.shape, b, t, pool, deadline,
                                            tag, &outcome->exec)
                        : exec::RunForward(**plan, call.rank, call.shape, b, t, pool, deadline,
                                           tag, &outcome->exec);
  // A failed rank takes its group down at once rather than at the deadline.
  if (!st.ok()) resources->fabric->AbortAll(st);
  return st;
}

}  // namespace hsap

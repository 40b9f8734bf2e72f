// Attention calls: validate at the entry, run, report stats.
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/exec/call_runner.h"
#include "server/grpc/attention_validation.h"
#include "server/grpc/services.h"
#include "server/grpc/session_auth.h"
#include "server/grpc/status_util.h"
#include "server/grpc/tcp_auth.h"
#include "server/plan/plan_spec.h"

namespace hsap {
namespace {

template <typename Request, typename Validate>
grpc::Status RunCall(DaemonState* state, const grpc::ServerContext& context, const Request& request,
                     Validate validate, hsap::v1::CallStats* stats);

// Every call, whatever its outcome, is counted in the metrics.
template <typename Request, typename Validate>
grpc::Status RunAndRecord(DaemonState* state, const grpc::ServerContext& context,
                          const Request& request, Validate validate, metrics::CallOp op,
                          hsap::v1::CallStats* stats) {
  const absl::Time start = absl::Now();
  state->metrics.AddQueueDepth(1);  // calls in the daemon: waiting for their group or running
  const grpc::Status st = RunCall(state, context, request, validate, stats);
  state->metrics.AddQueueDepth(-1);
  std::string strategy = "other";
  if (st.ok()) {
    strategy = std::string(plan::StrategyName(static_cast<plan::Strategy>(stats->strategy())));
  }
  state->metrics.RecordCall(op, strategy, static_cast<absl::StatusCode>(st.error_code()),
                            absl::ToDoubleSeconds(absl::Now() - start));
  state->RefreshGauges();
  return st;
}

template <typename Request, typename Validate>
grpc::Status RunCall(DaemonState* state, const grpc::ServerContext& context, const Request& request,
                     Validate validate, hsap::v1::CallStats* stats) {
  const absl::Time start = absl::Now();
  absl::Status admitted = state->gate.Enter();
  if (!admitted.ok()) return ToGrpcStatus(admitted);
  CallGate::Ticket ticket(&state->gate);
  absl::StatusOr<uint64_t> session = SessionOf(context, state->sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  absl::StatusOr<AttentionCall> call = validate(request, *session, &state->regions, state->limits);
  if (!call.ok()) return ToGrpcStatus(call.status());
  call->cancelled = [&context] { return context.IsCancelled(); };
  call->session = *session;  // hardening wiring: the matcher scopes groups to sessions
  CallOutcome outcome;
  absl::Status st =
      RunCall(*call, state->runner, &state->plans, &state->matcher, &state->active, state->slots.get(),
              &outcome);
  // --- hardening wiring: a region the client shrank under the call (SIGBUS
  // caught, zero pages read) voids the call's results, whatever it returned.
  for (const BoundTensor* t : {&call->q, &call->k, &call->v, &call->o, &call->lse, &call->d_o,
                               &call->dq, &call->dk, &call->dv}) {
    if (absl::Status intact = t->pin.CheckIntact(); !intact.ok()) {
      st = std::move(intact);
      break;
    }
  }
  // --- end of hardening wiring.
  if (!st.ok()) {
    HSAP_LOG(WARNING) << "call " << call->group << "/" << call->call_seq << " rank " << call->rank
                      << " failed: " << st;
    return ToGrpcStatus(st);
  }
  state->calls_total.fetch_add(1, std::memory_order_relaxed);
  for (int tier = 0; tier < 2; ++tier) {
    const auto t = static_cast<metrics::LinkTier>(tier);
    state->metrics.RecordTransfer(metrics::TransferDirection::kSent, t, outcome.exec.sent_bytes[tier]);
    state->metrics.RecordTransfer(metrics::TransferDirection::kReceived, t,
                                  outcome.exec.received_bytes[tier]);
  }
  state->metrics.RecordDeviceBusy(outcome.slot, outcome.exec.compute_seconds);
  state->busy_micros.fetch_add(static_cast<uint64_t>(outcome.exec.compute_seconds * 1e6),
                               std::memory_order_relaxed);
  stats->set_plan_key(outcome.plan_key);
  stats->set_strategy(static_cast<hsap::v1::Strategy>(outcome.strategy));
  stats->set_plan_cache_hit(outcome.plan_cache_hit);
  stats->set_bytes_sent(outcome.exec.sent_bytes[0] + outcome.exec.sent_bytes[1]);
  stats->set_bytes_received(outcome.exec.received_bytes[0] + outcome.exec.received_bytes[1]);
  stats->set_area(outcome.exec.area);
  stats->set_wait_seconds(outcome.wait_seconds);
  stats->set_compute_seconds(outcome.exec.compute_seconds);
  stats->set_total_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return grpc::Status::OK;
}

}  // namespace

grpc::Status AttentionService::Forward(grpc::ServerContext* context,
                                       const hsap::v1::AttentionForwardRequest* request,
                                       hsap::v1::AttentionForwardResponse* response) {
  if (auto caller = AuthorizeCall(*context, state_->tcp_token); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return RunAndRecord(state_, *context, *request, ValidateForward, metrics::CallOp::kForward,
                      response->mutable_stats());
}

grpc::Status AttentionService::Backward(grpc::ServerContext* context,
                                        const hsap::v1::AttentionBackwardRequest* request,
                                        hsap::v1::AttentionBackwardResponse* response) {
  if (auto caller = AuthorizeCall(*context, state_->tcp_token); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return RunAndRecord(state_, *context, *request, ValidateBackward, metrics::CallOp::kBackward,
                      response->mutable_stats());
}

}  // namespace hsap

// Attention calls: validate at the entry, run, report stats.
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/exec/call_runner.h"
#include "server/grpc/attention_validation.h"
#include "server/grpc/services.h"
#include "server/grpc/session_auth.h"
#include "server/grpc/status_util.h"

namespace hsap {
namespace {

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
  CallOutcome outcome;
  absl::Status st =
      RunCall(*call, state->runner, &state->plans, &state->matcher, &state->active, &state->pool,
              &outcome);
  if (!st.ok()) {
    HSAP_LOG(WARNING) << "call " << call->group << "/" << call->call_seq << " rank " << call->rank
                      << " failed: " << st;
    return ToGrpcStatus(st);
  }
  state->calls_total.fetch_add(1, std::memory_order_relaxed);
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
  return RunCall(state_, *context, *request, ValidateForward, response->mutable_stats());
}

grpc::Status AttentionService::Backward(grpc::ServerContext* context,
                                        const hsap::v1::AttentionBackwardRequest* request,
                                        hsap::v1::AttentionBackwardResponse* response) {
  return RunCall(state_, *context, *request, ValidateBackward, response->mutable_stats());
}

}  // namespace hsap

// Attention calls: validate at the entry, run, report stats.
#include <new>

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
grpc::Status RunCall(const AttentionDeps& deps, const grpc::ServerContext& context, const Request& request,
                     Validate validate, hsap::v1::CallStats* stats);

// Every call, whatever its outcome, is counted in the metrics.
template <typename Request, typename Validate>
grpc::Status RunAndRecord(const AttentionDeps& deps, const grpc::ServerContext& context,
                          const Request& request, Validate validate, metrics::CallOp op,
                          hsap::v1::CallStats* stats) {
  const absl::Time start = absl::Now();
  deps.metrics->AddQueueDepth(1);  // calls in the daemon: waiting for their group or running
  grpc::Status st;
  // The daemon uses no exceptions, but the standard library's containers
  // throw when memory runs out; none may escape into gRPC ("UNKNOWN").
  try {
    st = RunCall(deps, context, request, validate, stats);
  } catch (const std::bad_alloc&) {
    st = ToGrpcStatus(absl::ResourceExhaustedError(
        "hsapd ran out of memory serving the call (see --memory_budget_bytes)"));
  }
  deps.metrics->AddQueueDepth(-1);
  std::string strategy = "other";
  if (st.ok()) {
    strategy = std::string(plan::StrategyName(static_cast<plan::Strategy>(stats->strategy())));
  }
  deps.metrics->RecordCall(op, strategy, static_cast<absl::StatusCode>(st.error_code()),
                            absl::ToDoubleSeconds(absl::Now() - start));
  deps.refresh_gauges();
  return st;
}

template <typename Request, typename Validate>
grpc::Status RunCall(const AttentionDeps& deps, const grpc::ServerContext& context, const Request& request,
                     Validate validate, hsap::v1::CallStats* stats) {
  const absl::Time start = absl::Now();
  absl::Status admitted = deps.gate->Enter();
  if (!admitted.ok()) return ToGrpcStatus(admitted);
  CallGate::Ticket ticket(deps.gate);
  absl::StatusOr<uint64_t> session = SessionOf(context, *deps.sessions);
  if (!session.ok()) return ToGrpcStatus(session.status());
  absl::StatusOr<AttentionCall> call = validate(request, *session, deps.regions, *deps.limits);
  if (!call.ok()) return ToGrpcStatus(call.status());
  call->cancelled = [&context] { return context.IsCancelled(); };
  call->session = *session;  // the matcher scopes groups to sessions
  CallOutcome outcome;
  absl::Status st = deps.runner->Run(*call, &outcome);
  // A region the client shrank under the call (SIGBUS caught, zero pages
  // read) voids the call's results, whatever it returned.
  for (const BoundTensor* t : {&call->q, &call->k, &call->v, &call->o, &call->lse, &call->d_o,
                               &call->dq, &call->dk, &call->dv}) {
    if (absl::Status intact = t->pin.CheckIntact(); !intact.ok()) {
      st = std::move(intact);
      break;
    }
  }
  if (!st.ok()) {
    HSAP_LOG(WARNING) << "call " << call->group << "/" << call->call_seq << " rank " << call->rank
                      << " failed: " << st;
    return ToGrpcStatus(st);
  }
  for (int tier = 0; tier < 2; ++tier) {
    const auto t = static_cast<metrics::LinkTier>(tier);
    deps.metrics->RecordTransfer(metrics::TransferDirection::kSent, t, outcome.exec.sent_bytes[tier]);
    deps.metrics->RecordTransfer(metrics::TransferDirection::kReceived, t,
                                  outcome.exec.received_bytes[tier]);
  }
  deps.metrics->RecordDeviceBusy(outcome.slot, outcome.exec.compute_seconds);
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
  if (auto caller = AuthorizeCall(*context, deps_.tcp_token); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return RunAndRecord(deps_, *context, *request, ValidateForward, metrics::CallOp::kForward,
                      response->mutable_stats());
}

grpc::Status AttentionService::Backward(grpc::ServerContext* context,
                                        const hsap::v1::AttentionBackwardRequest* request,
                                        hsap::v1::AttentionBackwardResponse* response) {
  if (auto caller = AuthorizeCall(*context, deps_.tcp_token); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  return RunAndRecord(deps_, *context, *request, ValidateBackward, metrics::CallOp::kBackward,
                      response->mutable_stats());
}

}  // namespace hsap

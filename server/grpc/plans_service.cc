#include "server/grpc/plans_service.h"

#include "absl/strings/str_cat.h"
#include "server/grpc/status_util.h"
#include "server/grpc/tcp_auth.h"
#include "server/plan/compiler.h"
#include "server/plan/plan_proto.h"

namespace hsap {
namespace {

// plan::Strategy and plan::AssignmentPolicy share the proto enums' numbers.
hsap::v1::Strategy ToProto(plan::Strategy s) { return static_cast<hsap::v1::Strategy>(s); }

hsap::v1::AssignmentPolicy ToProto(plan::AssignmentPolicy a) {
  return static_cast<hsap::v1::AssignmentPolicy>(a);
}

hsap::v1::PlanSummary Summary(const plan::PlanCacheEntry& e) {
  hsap::v1::PlanSummary s;
  s.set_plan_key(e.key.ToHex());
  s.set_strategy(ToProto(e.strategy));
  s.set_assignment(ToProto(e.assignment));
  s.set_ranks(e.num_ranks);
  s.set_total_tokens(e.total_tokens);
  s.set_size_bytes(e.bytes);
  s.set_hits(e.hits);
  s.set_compile_seconds(e.compile_us * 1e-6);
  s.set_modeled_us(e.modeled_us);
  return s;
}

// The input limits of Attention calls (attention_validation.h), for specs.
absl::StatusOr<plan::PlanSpec> SpecWithinLimits(const hsap::v1::PlanSpec& proto,
                                                const plan::SpecDefaults& defaults,
                                                const ValidationLimits& limits) {
  if (proto.cu_seqlens_size() > limits.max_slices + 1) {
    return absl::InvalidArgumentError(absl::StrCat("spec.cu_seqlens has ", proto.cu_seqlens_size(),
                                                   " entries; at most ", limits.max_slices + 1));
  }
  if (proto.slices_size() > limits.max_slices) {
    return absl::InvalidArgumentError(absl::StrCat("spec.slices has ", proto.slices_size(),
                                                   " slices; at most ", limits.max_slices));
  }
  if (proto.total_tokens() > limits.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("spec.total_tokens is ", proto.total_tokens(),
                                                   "; at most ", limits.max_tokens));
  }
  if (proto.shape().num_heads_q() > limits.max_heads) {
    return absl::InvalidArgumentError(absl::StrCat("spec.shape.num_heads_q is ",
                                                   proto.shape().num_heads_q(), "; at most ",
                                                   limits.max_heads));
  }
  return plan::PlanSpecFromProto(proto, defaults);
}

absl::StatusOr<plan::PlanKey> ParseKey(const std::string& hex) {
  plan::PlanKey key;
  if (!plan::PlanKey::FromHex(hex, &key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan_key '", hex.substr(0, 40), "' is not 32 hex digits"));
  }
  return key;
}

}  // namespace

grpc::Status PlansService::Dispatch(grpc::ServerContext* context, const hsap::v1::DispatchRequest* request,
                                    hsap::v1::DispatchResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  auto spec = SpecWithinLimits(request->spec(), defaults_, limits_);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  const std::function<bool()> stop = [context] { return context->IsCancelled(); };
  auto p = cache_->GetOrCompile(*spec, nullptr, &stop);
  if (!p.ok()) return ToGrpcStatus(p.status());
  *response->mutable_dispatch() = plan::DispatchToProto((*p)->dispatch);
  response->set_strategy(ToProto((*p)->strategy));
  response->set_plan_key((*p)->key.ToHex());
  *response->mutable_stats() = plan::PlanStatsToProto((*p)->stats);
  for (const plan::RankPlan& rp : (*p)->ranks) {
    response->add_inter_recv_bytes_per_rank(
        rp.stats.fwd_recv_bytes[static_cast<int>(plan::LinkTier::kInterNode)]);
  }
  return grpc::Status::OK;
}

grpc::Status PlansService::CompilePlan(grpc::ServerContext* context,
                                       const hsap::v1::CompilePlanRequest* request,
                                       hsap::v1::CompilePlanResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  auto spec = SpecWithinLimits(request->spec(), defaults_, limits_);
  if (!spec.ok()) return ToGrpcStatus(spec.status());
  std::shared_ptr<const plan::Plan> p;
  // A compile whose caller went away (or whose deadline passed) stops.
  const std::function<bool()> stop = [context] { return context->IsCancelled(); };
  if (request->skip_cache()) {
    auto compiled = plan::CompilePlan(*spec, {.stop = &stop});
    if (!compiled.ok()) return ToGrpcStatus(compiled.status());
    p = std::make_shared<const plan::Plan>(std::move(compiled).value());
  } else {
    bool hit = false;
    auto cached = cache_->GetOrCompile(*spec, &hit, &stop);
    if (!cached.ok()) return ToGrpcStatus(cached.status());
    p = std::move(cached).value();
    response->set_cache_hit(hit);
  }
  response->set_plan_key(p->key.ToHex());
  *response->mutable_stats() = plan::PlanStatsToProto(p->stats);
  for (const plan::RankPlan& rp : p->ranks) {
    response->add_inter_recv_bytes_per_rank(
        rp.stats.fwd_recv_bytes[static_cast<int>(plan::LinkTier::kInterNode)]);
  }
  if (request->include_plan()) *response->mutable_plan() = plan::PlanToProto(*p);
  return grpc::Status::OK;
}

grpc::Status PlansService::ListPlans(grpc::ServerContext* context, const hsap::v1::ListPlansRequest* request,
                                     hsap::v1::ListPlansResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  if (request->limit() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("limit is ", request->limit(), "; it must be >= 0 (0 = all)")));
  }
  for (const auto& e : cache_->List()) {
    if (request->limit() > 0 && response->plans_size() >= request->limit()) break;
    *response->add_plans() = Summary(e);
  }
  return grpc::Status::OK;
}

grpc::Status PlansService::ShowPlan(grpc::ServerContext* context, const hsap::v1::ShowPlanRequest* request,
                                    hsap::v1::ShowPlanResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  auto key = ParseKey(request->plan_key());
  if (!key.ok()) return ToGrpcStatus(key.status());
  auto p = cache_->Show(*key);
  if (!p.ok()) return ToGrpcStatus(p.status());
  for (const auto& e : cache_->List()) {
    if (e.key == *key) *response->mutable_summary() = Summary(e);
  }
  *response->mutable_plan() = plan::PlanToProto(**p);
  return grpc::Status::OK;
}

grpc::Status PlansService::GetPlanCacheStats(grpc::ServerContext* context,
                                             const hsap::v1::GetPlanCacheStatsRequest*,
                                             hsap::v1::GetPlanCacheStatsResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  const plan::PlanCacheStats s = cache_->Stats();
  auto* out = response->mutable_stats();
  out->set_hits(s.hits);
  out->set_misses(s.misses);
  out->set_evictions(s.evictions);
  out->set_entries(s.entries);
  out->set_size_bytes(s.bytes);
  out->set_capacity_bytes(s.max_bytes);
  out->set_compile_seconds_total(s.compile_us_total * 1e-6);
  out->set_compile_seconds_max(s.compile_us_max * 1e-6);
  return grpc::Status::OK;
}

grpc::Status PlansService::EvictPlans(grpc::ServerContext* context, const hsap::v1::EvictPlansRequest* request,
                                      hsap::v1::EvictPlansResponse* response) {
  if (auto caller = AuthorizeCall(*context, tcp_token_); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  if (request->all()) {
    if (request->plan_keys_size() > 0) {
      return ToGrpcStatus(absl::InvalidArgumentError("give plan_keys or all = true, not both"));
    }
    response->set_evicted(static_cast<uint32_t>(cache_->Clear()));
    return grpc::Status::OK;
  }
  uint32_t evicted = 0;
  for (const std::string& hex : request->plan_keys()) {
    auto key = ParseKey(hex);
    if (!key.ok()) return ToGrpcStatus(key.status());
    if (cache_->Evict(*key).ok()) ++evicted;
  }
  response->set_evicted(evicted);
  return grpc::Status::OK;
}

}  // namespace hsap

// The Plans service (proto/hsap/v1/plans.proto): the planner and its cache
// over gRPC, for trainers (Dispatch) and operators (compile, list, show,
// stats, evict). Stateless apart from the daemon's plan cache.
#ifndef HSAP_SERVER_GRPC_PLANS_SERVICE_H_
#define HSAP_SERVER_GRPC_PLANS_SERVICE_H_

#include <string>

#include "hsap/v1/plans.grpc.pb.h"
#include "server/exec/attention_call.h"
#include "server/plan/plan_cache.h"
#include "server/plan/plan_proto.h"

namespace hsap {

class PlansService final : public hsap::v1::Plans::Service {
 public:
  // `tcp_token`: what TCP calls must carry (tcp_auth.h); empty: TCP is open.
  // `defaults`: the daemon's choices for unset spec fields (its --profile),
  // the same its Attention calls use.
  // `limits`: the input limits of Attention calls, which specs obey too.
  explicit PlansService(plan::PlanCache* cache, std::string tcp_token = {},
                        plan::SpecDefaults defaults = {}, ValidationLimits limits = {})
      : cache_(cache),
        tcp_token_(std::move(tcp_token)),
        defaults_(std::move(defaults)),
        limits_(limits) {}

  grpc::Status Dispatch(grpc::ServerContext* context, const hsap::v1::DispatchRequest* request,
                        hsap::v1::DispatchResponse* response) override;
  grpc::Status CompilePlan(grpc::ServerContext* context,
                           const hsap::v1::CompilePlanRequest* request,
                           hsap::v1::CompilePlanResponse* response) override;
  grpc::Status ListPlans(grpc::ServerContext* context, const hsap::v1::ListPlansRequest* request,
                         hsap::v1::ListPlansResponse* response) override;
  grpc::Status ShowPlan(grpc::ServerContext* context, const hsap::v1::ShowPlanRequest* request,
                        hsap::v1::ShowPlanResponse* response) override;
  grpc::Status GetPlanCacheStats(grpc::ServerContext* context,
                                 const hsap::v1::GetPlanCacheStatsRequest* request,
                                 hsap::v1::GetPlanCacheStatsResponse* response) override;
  grpc::Status EvictPlans(grpc::ServerContext* context, const hsap::v1::EvictPlansRequest* request,
                          hsap::v1::EvictPlansResponse* response) override;

 private:
  plan::PlanCache* const cache_;
  const std::string tcp_token_;
  const plan::SpecDefaults defaults_;
  const ValidationLimits limits_;
};

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_PLANS_SERVICE_H_

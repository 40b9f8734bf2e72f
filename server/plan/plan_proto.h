// Conversion between the plan domain types (plan.h, plan_spec.h,
// dispatch.h) and their proto form (proto/hsap/v1/plan.proto).
//
// PlanFromProto(PlanToProto(p)) == p, and its key is recomputed from the spec
// and checked against the stored one, so a plan read back has the key it
// was written with. Requests (PlanSpec) from the wire map proto defaults to
// the server's: strategy UNSPECIFIED -> auto, assignment UNSPECIFIED ->
// balanced, profile "" -> "h100", recv_buffer_bytes 0 -> 256 MiB.
#ifndef HSAP_SERVER_PLAN_PLAN_PROTO_H_
#define HSAP_SERVER_PLAN_PLAN_PROTO_H_

#include "absl/status/statusor.h"
#include "hsap/v1/plan.pb.h"
#include "server/plan/plan.h"

namespace hsap::plan {

hsap::v1::PlanSpec PlanSpecToProto(const PlanSpec& spec);
// INVALID_ARGUMENT naming the field for enum values that have no meaning
// here (e.g. dtype DTYPE_INT32). Does not run ValidatePlanSpec.
absl::StatusOr<PlanSpec> PlanSpecFromProto(const hsap::v1::PlanSpec& proto);

hsap::v1::Dispatch DispatchToProto(const Dispatch& dispatch);
Dispatch DispatchFromProto(const hsap::v1::Dispatch& proto);

hsap::v1::PlanStats PlanStatsToProto(const PlanStats& stats);
hsap::v1::RankStats RankStatsToProto(const RankStats& stats);

hsap::v1::Plan PlanToProto(const Plan& plan);
// INVALID_ARGUMENT when the spec is invalid, an enum is out of range, or the
// stored plan_key is not the key of the spec and format version.
absl::StatusOr<Plan> PlanFromProto(const hsap::v1::Plan& proto);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_PROTO_H_

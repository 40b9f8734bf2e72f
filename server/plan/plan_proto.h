// Conversion between the plan domain types (plan.h, plan_spec.h,
// dispatch.h) and their proto form (proto/hsap/v1/plan.proto).
//
// PlanFromProto(PlanToProto(p)) == p, and its key is recomputed from the spec
// and checked against the stored one, so a plan read back has the key it
// was written with. Requests (PlanSpec) from the wire map proto defaults to
// the server's: strategy UNSPECIFIED -> auto, assignment UNSPECIFIED ->
// balanced, profile "" -> the daemon's --profile (SpecDefaults),
// recv_buffer_bytes 0 -> 256 MiB; dtype UNSPECIFIED is refused.
#ifndef HSAP_SERVER_PLAN_PLAN_PROTO_H_
#define HSAP_SERVER_PLAN_PLAN_PROTO_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "hsap/v1/plan.pb.h"
#include "server/plan/plan.h"

namespace hsap::plan {

hsap::v1::PlanSpec PlanSpecToProto(const PlanSpec& spec);
// INVALID_ARGUMENT naming the field for enum values that have no meaning
// here (e.g. dtype DTYPE_INT32). Does not run ValidatePlanSpec.
// The defaults of a spec's unset fields that are the daemon's to choose.
struct SpecDefaults {
  std::string profile = "cpu-loopback";  // the daemon's --profile
  // Resolves the profile "measured" (kMeasuredProfile, given or the
  // default) for a spec's dtype and head dim to the daemon's measured
  // "custom:..." profile. Unset: "measured" is refused (INVALID_ARGUMENT).
  std::function<absl::StatusOr<std::string>(DType dtype, int32_t head_dim)> measured;
};

// The one conversion of request fields to a PlanSpec, used by the Plans
// service and (field by field, below) by Attention calls, so that both
// compile the same plan for the same inputs. Unset fields: strategy -> auto,
// assignment -> balanced, window (and a slice's window) -> none (-1),
// profile -> defaults.profile, recv_buffer_bytes -> the default. A dtype
// must be given. Errors are INVALID_ARGUMENT naming the field.
absl::StatusOr<PlanSpec> PlanSpecFromProto(const hsap::v1::PlanSpec& proto,
                                           const SpecDefaults& defaults = {});

// The shared pieces. `field` names the field in errors.
absl::StatusOr<DType> DTypeFromProto(hsap::v1::DType t, absl::string_view field);
hsap::v1::DType DTypeToProto(DType t);
absl::StatusOr<Strategy> StrategyFromProto(hsap::v1::Strategy s, absl::string_view field);
absl::StatusOr<AssignmentPolicy> AssignmentFromProto(hsap::v1::AssignmentPolicy a,
                                                     absl::string_view field);
absl::StatusOr<MaskSlice> MaskSliceFromProto(const hsap::v1::MaskSlice& s, absl::string_view field);
std::string ProfileOrDefault(const std::string& profile, const SpecDefaults& defaults);

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

// Fuzzes plan requests as they arrive over gRPC (the Plans service):
// a serialized hsap.v1.PlanSpec -> PlanSpecFromProto -> ValidatePlanSpec,
// and a spec that passes must compile (CompilePlan) to a plan whose proto
// round trip is lossless. Sizes are whatever the wire carries (up to the
// 2^40 tokens ValidatePlanSpec allows): the compiler's interval arithmetic
// must not overflow (UBSan). Topologies above 64 ranks are validated but not
// compiled (plans grow as P^2). A first byte of 1 instead parses a whole
// hsap.v1.Plan and reads it back with PlanFromProto (plans read from files).
#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/plan.pb.h"
#include "absl/strings/str_cat.h"
#include "server/plan/compiler.h"
#include "server/plan/plan_key.h"
#include "server/plan/plan_proto.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::plan {
namespace {

void CheckError(const absl::Status& st) {
  if (st.code() != absl::StatusCode::kInvalidArgument) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(!st.message().empty());
}

void FuzzSpec(const hsap::v1::PlanSpec& proto) {
  absl::StatusOr<PlanSpec> spec = PlanSpecFromProto(proto);
  if (!spec.ok()) return CheckError(spec.status());
  const absl::Status valid = ValidatePlanSpec(*spec);
  if (std::getenv("HSAP_FUZZ_DEBUG") != nullptr) {
    std::fprintf(stderr, "%s\nvalid: %s\n", proto.DebugString().c_str(), valid.ToString().c_str());
  }
  if (!valid.ok()) return CheckError(valid);
  FUZZ_CHECK(PlanSpecFromProto(PlanSpecToProto(*spec)).value() == *spec);
  (void)ComputePlanKey(*spec, 1);
  if (spec->topology.num_ranks() > 64 || spec->slices.size() + spec->cu_seqlens.size() > 4096) return;
  absl::StatusOr<Plan> plan = CompilePlan(*spec);
  if (!plan.ok()) std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
  // The one error a valid spec may still get: more than kMaxStages stages
  // under its receive budget (plan_spec.h).
  if (!plan.ok() && absl::IsInvalidArgument(plan.status()) &&
      plan.status().message().find(absl::StrCat("stages, more than ", kMaxStages)) !=
          absl::string_view::npos) {
    return;
  }
  FUZZ_CHECK(plan.ok());
  absl::StatusOr<Plan> back = PlanFromProto(PlanToProto(*plan));
  FUZZ_CHECK(back.ok() && *back == *plan);
}

void FuzzPlan(const hsap::v1::Plan& proto) {
  if (proto.spec().topology().num_nodes() * int64_t{proto.spec().topology().devices_per_node()} > 64) return;
  absl::StatusOr<Plan> plan = PlanFromProto(proto);
  if (!plan.ok()) return CheckError(plan.status());
  absl::StatusOr<Plan> back = PlanFromProto(PlanToProto(*plan));
  FUZZ_CHECK(back.ok() && *back == *plan);
}

}  // namespace
}  // namespace hsap::plan

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] == 1) {
    hsap::v1::Plan plan;
    if (plan.ParseFromArray(data + 1, static_cast<int>(size - 1))) hsap::plan::FuzzPlan(plan);
  } else {
    hsap::v1::PlanSpec spec;
    if (spec.ParseFromArray(data + 1, static_cast<int>(size - 1))) hsap::plan::FuzzSpec(spec);
  }
  return 0;
}

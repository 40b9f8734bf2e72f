// Fuzzes the plan compiler (server/plan/compiler.h) on any small structure
// the input describes: CompilePlan (and CompilePlanForDispatch with a
// fuzzed token assignment) must either return a precise INVALID_ARGUMENT or
// a plan that passes the planner's own brute-force checker
// (server/plan/plan_checker.h: coverage, transfers, budget, exact need), a
// valid dispatch, and a lossless proto round trip with the same key.
// A spec that ValidatePlanSpec accepts must compile, unless packing it
// under its receive budget would take more than kMaxStages stages (then the
// error says so).
//
// Sizes stay small (T <= 48, P <= 16, Hq <= 6) because the checker costs
// T^2 * Hq; UBSan watches the arithmetic on the way.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/plan/compiler.h"
#include "server/plan/dispatch.h"
#include "server/plan/plan_checker.h"
#include "server/plan/plan_key.h"
#include "server/plan/plan_proto.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::plan {
namespace {

using fuzz::Value;

PlanSpec BuildSpec(FuzzedDataProvider& in) {
  PlanSpec spec;
  const bool edge = in.ConsumeIntegralInRange<int>(0, 15) == 0;  // out-of-range fields
  spec.topology.num_nodes = edge ? static_cast<int32_t>(Value(in, 5, INT32_MAX))
                                 : in.ConsumeIntegralInRange<int32_t>(1, 4);
  spec.topology.devices_per_node = in.ConsumeIntegralInRange<int>(0, 15) == 0
                                       ? static_cast<int32_t>(Value(in, 5, INT32_MAX))
                                       : in.ConsumeIntegralInRange<int32_t>(1, 4);
  const int64_t t = in.ConsumeIntegralInRange<int64_t>(0, 48);
  spec.total_tokens = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? Value(in, 50, int64_t{1} << 41) : t;
  spec.shape.num_heads_kv = in.ConsumeIntegralInRange<int32_t>(1, 3);
  spec.shape.num_heads_q = spec.shape.num_heads_kv * in.ConsumeIntegralInRange<int32_t>(1, 2);
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
    spec.shape.num_heads_q = static_cast<int32_t>(Value(in, 7, INT32_MAX));
  }
  spec.shape.head_dim = in.ConsumeIntegralInRange<int>(0, 15) == 0
                            ? static_cast<int32_t>(Value(in, 9, INT32_MAX))
                            : 8 * in.ConsumeIntegralInRange<int32_t>(1, 16);
  spec.shape.dtype = static_cast<DType>(in.ConsumeIntegralInRange<int>(0, 15) == 0
                                            ? in.ConsumeIntegral<uint8_t>()
                                            : in.ConsumeIntegralInRange<int>(0, 2));
  spec.strategy = static_cast<Strategy>(in.ConsumeIntegralInRange<int>(0, 15) == 0
                                            ? in.ConsumeIntegral<uint8_t>()
                                            : in.ConsumeIntegralInRange<int>(1, 7));
  spec.assignment = static_cast<AssignmentPolicy>(in.ConsumeIntegralInRange<int>(0, 15) == 0
                                                      ? in.ConsumeIntegral<uint8_t>()
                                                      : in.ConsumeIntegralInRange<int>(1, 3));
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: spec.profile = "cpu-loopback"; break;
    case 1: spec.profile = in.ConsumeRandomLengthString(12); break;
    default: spec.profile = "h100"; break;
  }
  const int64_t kappa = 2 * int64_t{spec.shape.num_heads_kv} * std::max(spec.shape.head_dim, 1) * 4;
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: spec.recv_buffer_bytes = Value(in, 4096, INT64_MAX); break;
    case 1: case 2: spec.recv_buffer_bytes = kappa * in.ConsumeIntegralInRange<int64_t>(1, 8); break;
    default: break;
  }
  spec.causal = in.ConsumeBool();
  if (in.ConsumeBool()) {
    // Packed documents.
    spec.cu_seqlens.push_back(in.ConsumeIntegralInRange<int>(0, 15) == 0 ? Value(in, 3, INT64_MAX) : 0);
    int64_t x = 0;
    const int docs = in.ConsumeIntegralInRange<int>(0, 8);
    for (int d = 0; d < docs && x < t; ++d) {
      x = std::min(t, x + in.ConsumeIntegralInRange<int64_t>(0, 14));
      spec.cu_seqlens.push_back(in.ConsumeIntegralInRange<int>(0, 31) == 0 ? Value(in, 50, INT64_MAX) : x);
    }
    if (in.ConsumeBool()) spec.cu_seqlens.push_back(t);
    spec.window = spec.causal && in.ConsumeBool() ? Value(in, 10, int64_t{1} << 42) : -1;
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) spec.window = Value(in, 10, INT64_MAX);
  } else {
    // Slices: bands of rows, each FULL or CAUSAL over some key range.
    int64_t q = 0;
    const int n = in.ConsumeIntegralInRange<int>(0, 6);
    for (int i = 0; i < n; ++i) {
      MaskSlice s;
      const bool overlap = in.ConsumeIntegralInRange<int>(0, 9) == 0;
      s.q_begin = overlap ? in.ConsumeIntegralInRange<int64_t>(0, t) : q;
      s.q_end = std::min(t, fuzz::AddSat(s.q_begin, in.ConsumeIntegralInRange<int64_t>(0, 16)));
      s.k_begin = in.ConsumeIntegralInRange<int64_t>(0, t);
      s.k_end = in.ConsumeIntegralInRange<int64_t>(s.k_begin, t);
      s.type = in.ConsumeBool() ? MaskType::kCausal : MaskType::kFull;
      if (s.type == MaskType::kCausal) {
        s.offset = in.ConsumeIntegralInRange<int64_t>(-20, 20);
        s.window = in.ConsumeBool() ? -1 : in.ConsumeIntegralInRange<int64_t>(0, 12);
      }
      if (in.ConsumeIntegralInRange<int>(0, 31) == 0) s.offset = Value(in, 5, INT64_MAX);
      if (in.ConsumeIntegralInRange<int>(0, 31) == 0) s.q_end = Value(in, 50, INT64_MAX);
      q = std::max(q, s.q_end);
      spec.slices.push_back(s);
    }
  }
  return spec;
}

// A token assignment: mostly a partition of [0, T) over the ranks.
Dispatch BuildDispatch(FuzzedDataProvider& in, const PlanSpec& spec) {
  Dispatch d;
  d.total_tokens = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? Value(in, 50, INT64_MAX)
                                                              : spec.total_tokens;
  const int32_t ranks = std::max(1, std::min(spec.topology.num_ranks(), 16)) +
                        (in.ConsumeIntegralInRange<int>(0, 15) == 0 ? 1 : 0);
  d.ranges.resize(ranks);
  int64_t x = 0;
  while (x < d.total_tokens && x < 64 && in.remaining_bytes() > 0) {
    const int64_t len = in.ConsumeIntegralInRange<int64_t>(in.ConsumeIntegralInRange<int>(0, 31) == 0 ? -2 : 1, 12);
    const int64_t end = std::min(d.total_tokens, x + len);
    auto& rr = d.ranges[in.ConsumeIntegralInRange<int32_t>(0, ranks - 1)];
    if (!rr.empty() && rr.back().end == x && in.ConsumeBool()) {
      rr.back().end = end;  // keep ranges non-adjacent, mostly
    } else {
      rr.push_back({x, end});
    }
    x = end > x ? end : x + 1;
  }
  return d;
}

void CheckPlan(const PlanSpec& spec, const Plan& plan) {
  FUZZ_CHECK(ValidateDispatch(plan.dispatch).ok());
  FUZZ_CHECK(plan.dispatch.total_tokens == spec.total_tokens);
  FUZZ_CHECK(plan.dispatch.num_ranks() == spec.topology.num_ranks());
  FUZZ_CHECK(static_cast<int32_t>(plan.ranks.size()) == spec.topology.num_ranks());
  absl::StatusOr<Plan> back = PlanFromProto(PlanToProto(plan));
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(*back == plan);
  FUZZ_CHECK(ComputePlanKey(back->spec, back->format_version) == plan.key);
  if (spec.total_tokens > 64) return;  // the checker is O(T^2 Hq)
  const absl::Status coverage = CheckCoverage(plan);
  const absl::Status transfers = CheckTransfers(plan);
  const absl::Status budget = CheckBudget(plan);
  if (!coverage.ok() || !transfers.ok() || !budget.ok()) {
    std::fprintf(stderr, "%s\n%s\n%s\n", coverage.ToString().c_str(),
                 transfers.ToString().c_str(), budget.ToString().c_str());
  }
  FUZZ_CHECK(coverage.ok() && transfers.ok() && budget.ok());
  const std::vector<int64_t> need = ExactNeedBruteForce(plan);
  const int64_t kappa = KvRowBytes(spec.shape, spec.shape.num_heads_kv);
  for (const RankPlan& rp : plan.ranks) {
    FUZZ_CHECK(rp.stats.exact_need_bytes == need[rp.rank] * kappa);
    FUZZ_CHECK(rp.stats.FwdRecvBytes() >= rp.stats.lower_bound_recv_bytes);
  }
}

void CheckError(const absl::Status& st) {
  if (st.code() != absl::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
  }
  FUZZ_CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(!st.message().empty());
}

}  // namespace
}  // namespace hsap::plan

// The one error a valid spec may still get (plan_spec.h, kMaxStages).
bool TooManyStages(const absl::Status& s) {
  return absl::IsInvalidArgument(s) &&
         s.message().find(absl::StrCat("stages, more than ", hsap::plan::kMaxStages)) !=
             absl::string_view::npos;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsap::plan;
  FuzzedDataProvider in(data, size);
  const bool with_dispatch = in.ConsumeIntegralInRange<int>(0, 3) == 0;
  const PlanSpec spec = BuildSpec(in);
  const absl::Status valid = ValidatePlanSpec(spec);
  if (std::getenv("HSAP_FUZZ_DEBUG") != nullptr) {
    std::fprintf(stderr, "%s\nvalid: %s\n", PlanSpecToProto(spec).DebugString().c_str(),
                 valid.ToString().c_str());
  }
  // Plans grow as P^2 (ulysses all-to-all, ring rounds): 2^16 ranks
  // (kMaxRanks) is valid but takes minutes; stay at cluster sizes here.
  if (valid.ok() && spec.topology.num_ranks() > 64) return 0;
  if (!with_dispatch) {
    absl::StatusOr<Plan> plan = CompilePlan(spec);
    FUZZ_CHECK(plan.ok() == valid.ok() || TooManyStages(plan.status()));
    if (plan.ok()) {
      CheckPlan(spec, *plan);
    } else {
      CheckError(plan.status());
    }
    return 0;
  }
  if (!valid.ok()) return 0;
  const Dispatch dispatch = BuildDispatch(in, spec);
  absl::StatusOr<Plan> plan = CompilePlanForDispatch(spec, dispatch);
  if (plan.ok()) {
    FUZZ_CHECK(plan->dispatch == dispatch);
    CheckPlan(spec, *plan);
  } else {
    CheckError(plan.status());
    FUZZ_CHECK(!ValidateDispatch(dispatch).ok() || dispatch.total_tokens != spec.total_tokens ||
               dispatch.num_ranks() != spec.topology.num_ranks());
  }
  return 0;
}

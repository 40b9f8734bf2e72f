// Input parsing and output formatting for `hsapctl plan`, kept apart from
// the flags so they can be tested.
#ifndef HSAP_CLIENT_HSAPCTL_PLAN_FORMAT_H_
#define HSAP_CLIENT_HSAPCTL_PLAN_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/plan/plan.h"

namespace hsap::hsapctl {

// Parses integers separated by commas, newlines or other whitespace
// ("0,100, 250\n300"). INVALID_ARGUMENT naming `what`, the entry index and
// the text for anything that is not an integer; empty input is an error.
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, absl::string_view what);

// Document lengths -> cu_seqlens ([0, l1, l1 + l2, ...]); negative lengths
// are INVALID_ARGUMENT naming the index.
absl::StatusOr<std::vector<int64_t>> LengthsToCuSeqlens(const std::vector<int64_t>& lengths);

// The plan as JSON. Per rank: rank, node, tokens, token_ranges ([begin,
// end) pairs), recv_bytes and send_bytes (forward), bwd_recv_bytes,
// bwd_send_bytes, area, lower_bound_recv_bytes, exact_need_bytes,
// peak_recv_buffer_bytes, modeled_fwd_us, modeled_bwd_us; at top level:
// plan_key, strategy, requested_strategy, assignment, profile, ranks,
// nodes, total_tokens, total_area, imbalance (max area / mean area),
// modeled_time_us (forward + backward), modeled_fwd_us, modeled_bwd_us,
// lower_bound_us, compile_us, max_recv_bytes, total_fwd_bytes, fwd_stages,
// bwd_stages, candidates (auto). With `include_plan`, "plan" holds the whole
// plan in proto JSON form.
std::string PlanToJson(const plan::Plan& plan, bool include_plan);

// The plan as text: PlanSummaryText(), and with `include_stages` every
// rank's forward stages.
std::string PlanToText(const plan::Plan& plan, bool include_stages);

}  // namespace hsap::hsapctl

#endif  // HSAP_CLIENT_HSAPCTL_PLAN_FORMAT_H_

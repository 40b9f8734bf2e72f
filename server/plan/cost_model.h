// Cost model: hardware profiles (named, or parametric "custom:...") and the
// modeled time of a plan.
//
// A profile gives each rank's link bandwidth per tier (intra-node, inter-node),
// a per-transfer latency per tier and the attention throughput (FLOP/s) of
// one rank. The model, per rank and stage:
//
//   transfer_s  = max over tiers of (latency + max(send, recv bytes) / bw)
//                 (tiers are separate links and run concurrently; where k
//                 ranks share an inter-node link, its bytes are the link's
//                 and its bw k times a rank's: inter_link_ranks)
//   stage_s     = max(transfer_s, compute(overlap_items)) + compute(items)
//                 + backward: max(return transfer, compute(return_overlap_items))
//   compute     = 4 * D * area * q_heads FLOP forward, 2.5x that backward,
//                 at flops * kv_interleave_factor^log2(kv_heads of the rank)
//
// and a layer's modeled time is the sum over stages of the slowest rank
// (stages are collective steps). Numbers are estimates, stated in
// docs/planner.md with their sources; the model ranks strategies, it does not
// promise wall time.
#ifndef HSAP_SERVER_PLAN_COST_MODEL_H_
#define HSAP_SERVER_PLAN_COST_MODEL_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/plan/plan.h"

namespace hsap::plan {

struct HardwareProfile {
  std::string name;
  std::string description;
  double intra_bytes_per_s = 0;  // per rank, one direction
  double inter_bytes_per_s = 0;  // per rank, one direction
  double intra_latency_s = 0;
  double inter_latency_s = 0;
  double attention_flops = 0;    // forward attention FLOP/s of one rank
  double backward_factor = 2.5;  // backward FLOPs / forward FLOPs
  // The per-head attention rate's factor per doubling of the KV heads a
  // rank holds interleaved in each row, in (0, 1]: a rank of h KV heads
  // computes at attention_flops * kv_interleave_factor^log2(h). 1 (no
  // effect) for the named profiles; measured for CPU slots (the kernels'
  // row stride h * D costs them cache; server/exec/measured_profile.h).
  double kv_interleave_factor = 1.0;
  // How many ranks of a node share one inter-node link (an integer >= 1):
  // 1 (the named profiles) is a NIC per rank. With k > 1 a node's ranks, in
  // rank order, form links of k; a link carries k * inter_bytes_per_s each
  // way and any one of its ranks may use all of it, so a rank's inter-node
  // term in a stage is latency + the link's bytes (the larger direction,
  // summed over its ranks) / (k * inter_bytes_per_s). The emulated cluster
  // (one shaped veth per node) and hsapd over UCX TCP (one connection per
  // pair of nodes) are such links.
  double inter_link_ranks = 1.0;
};

// The named profiles: "h100", "h200", "cpu-loopback".
std::vector<std::string> HardwareProfileNames();

// The prefix of a parametric profile, and its fields (the HardwareProfile
// members they set, with their units in the name):
//
//   custom:flops=6.2e9,inter_bytes_per_s=7.1e5,intra_bytes_per_s=2e9,
//          inter_latency_us=250,intra_latency_us=30,backward_factor=2.5
//   (one string, no spaces)
//
// flops (attention FLOP/s of one rank, forward), inter_bytes_per_s and
// intra_bytes_per_s (per rank, one direction) are required; the latencies
// (microseconds per transfer, default 0), backward_factor (backward
// FLOPs over forward FLOPs, default 2.5), kv_interleave_factor (in
// (0, 1], default 1; written only when not 1) and inter_link_ranks (an
// integer in [1, 1024], default 1; written only when not 1) are optional. Values are decimal
// or scientific numbers; each field at most once. The profile's name is the
// whole string (it is part of the plan key, so every node of a group must
// be given the same string).
inline constexpr absl::string_view kCustomProfilePrefix = "custom:";

// hsapd's --profile default: not a profile but the rule that a daemon plans
// with what it measured (its compute rate per dtype and head dim, its links
// to a group's members; docs/cost_model.md, "Measured profiles"), resolved to
// a parametric profile before any plan is compiled. ParseHardwareProfile
// refuses it.
inline constexpr absl::string_view kMeasuredProfile = "measured";
// What "measured" resolves to for a one-rank plan, which moves nothing and
// has nothing to choose between (no measurement is run for it).
inline constexpr absl::string_view kOneRankProfile = "cpu-loopback";

// A named profile or a parametric one. INVALID_ARGUMENT naming the profile
// and, for a parametric one, the field and its value: an unknown name or
// field, a missing, repeated or empty field, a value that is not a number or
// is out of range (flops in [1, 1e21], bandwidths in [1, 1e15] bytes/s,
// latencies in [0, 1e9] us, backward_factor in (0, 100]).
absl::StatusOr<HardwareProfile> ParseHardwareProfile(absl::string_view name);

// The canonical parametric string of `p` (every field, shortest round-trip
// numbers that read back exactly where one exists):
// ParseHardwareProfile(CustomProfileString(p)) gives p's figures.
std::string CustomProfileString(const HardwareProfile& p);

// ParseHardwareProfile(name).ok().
bool IsKnownProfile(absl::string_view name);
// REQUIRES: IsKnownProfile(name).
HardwareProfile GetHardwareProfile(absl::string_view name);

// `x` rounded to three significant digits (0, negative and non-finite
// values stay as they are): how measured profile figures are written.
double RoundToThreeDigits(double x);

struct Plan;

// Fills the modeled times of every rank (RankStats::*_us) and of the plan
// (PlanStats::fwd_us, bwd_us, modeled_us, lower_bound_us).
void ModelPlanTime(const HardwareProfile& profile, Plan* plan);

// The same in two halves, for a caller that models each rank where it
// builds it (the compiler, over its pool). ModelRank fills rp's modeled
// times (RankStats::*_us) from its per-stage bytes and the work-item areas
// stage_area[s] = {area of overlap_items, area of items} of its forward
// stage s and of its backward stage s (the compiler's backward stages repeat
// the forward items; the ranks of a head group share theirs, so the compiler
// sums each inner stage once; for inter_link_ranks > 1, which needs every
// rank's bytes first, it calls ModelPlanTime instead). FinishModel then
// takes the slowest rank of
// each stage (PlanStats::fwd_us, bwd_us, modeled_us, lower_bound_us).
// The model's transfer term of one rank in one stage: tiers in parallel,
// each the larger of what the rank sends and receives on it, plus the
// tier's latency when it moves anything. With inter_link_ranks k > 1 the
// inter-node bytes given are taken as the link's, at k times a rank's
// bandwidth; given one rank's own bytes, that is a lower bound of the
// model's term (the link's bytes are at least the rank's), which is how
// auto's bounds use it.
double StageTransferSeconds(const HardwareProfile& profile,
                            const std::array<int64_t, kNumTiers>& send_bytes,
                            const std::array<int64_t, kNumTiers>& recv_bytes);

struct RankModel {
  std::vector<double> fwd_s, bwd_s;  // per stage, seconds
  double lb_fwd_s = 0, lb_bwd_s = 0;
};
// Bytes one rank moves in one stage, by tier: its sends and receives, and
// (backward) its dK/dV returns.
struct StageBytes {
  std::array<int64_t, kNumTiers> send{}, recv{};
  std::array<int64_t, kNumTiers> return_send{}, return_recv{};
};
// REQUIRES: fwd_bytes[s] / bwd_bytes[s] are the sums of rp's forward /
// backward stage s (the compiler derives a backward stage's from its
// forward stage's: the same transfers, returns mirrored), stage_area as
// above.
// bwd_return_overlap_area[s] (may be shorter than the backward: 0 beyond)
// is the part of stage_area[s][0] that backward stage s computes under its
// returns (Stage::return_overlap_items) instead of under its transfers.
RankModel ModelRank(const HardwareProfile& profile, int64_t head_dim,
                    const std::vector<std::array<int64_t, 2>>& stage_area,
                    const std::vector<int64_t>& bwd_return_overlap_area,
                    const std::vector<StageBytes>& fwd_bytes,
                    const std::vector<StageBytes>& bwd_bytes, RankPlan* rp);
// ModelRank with each pass's areas given per stage of rp: {overlap_items,
// items, return_overlap_items} (forward: the third is 0).
RankModel ModelRankAreas(const HardwareProfile& profile, int64_t head_dim,
                         const std::vector<std::array<int64_t, 3>>& fwd_area,
                         const std::vector<std::array<int64_t, 3>>& bwd_area,
                         const std::vector<StageBytes>& fwd_bytes,
                         const std::vector<StageBytes>& bwd_bytes, RankPlan* rp);
void FinishModel(const std::vector<RankModel>& models, PlanStats* stats);

// Modeled seconds of one allowed (q, k) pair for a rank of `heads` query
// and `kv_heads` KV heads, forward or backward.
double AreaSeconds(const HardwareProfile& profile, int64_t head_dim, int64_t heads,
                   int64_t kv_heads, bool backward);

// Allowed (q, k) pairs of the items (per head).
int64_t ItemsArea(const WorkItemList& items);
int64_t ItemArea(const WorkItem& item);

// The fewest leading items of `items` whose modeled compute (forward or
// backward, a rank of `heads` query and `kv_heads` KV heads) takes at least
// `seconds`; all of them when they take less. The compiler keeps that many
// of a backward stage's home items under its K/V transfer and computes the
// rest under its returns: stage time max(xfer, A) + after + max(ret, B) is
// then the least any split of A + B gives, up to one item.
size_t ItemsCovering(const HardwareProfile& profile, int64_t head_dim, int64_t heads,
                     int64_t kv_heads, bool backward, double seconds,
                     const WorkItemList& items);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_COST_MODEL_H_

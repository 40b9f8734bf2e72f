// Internal to the compiler: hsap's pipelined inter-node level (docs/planner.md,
// "The pipelined inter-node stage"): the backward stages whose exchanges
// carry the returns of earlier chunks, and the schedule of the home items
// over the level's stages.
#ifndef HSAP_SERVER_PLAN_PIPELINED_LEVEL_H_
#define HSAP_SERVER_PLAN_PIPELINED_LEVEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "server/plan/cost_model.h"
#include "server/plan/plan.h"

namespace hsap::plan::internal {

// A rank's bytes per stage (the compiler's SumRankBytes).
struct RankBytes {
  std::vector<StageBytes> fwd, bwd;
  // Per forward stage: the extent of the receive buffer its K/V receives
  // fill (a pipelined level's chunks share the buffer).
  std::vector<int64_t> fwd_buffer;
  // Per backward stage: the largest return buffer one of its exchanges fills.
  std::vector<int64_t> bwd_return_buffer;
};

// A rank's transfer term in a stage as the compiler's item schedules
// estimate it before the plan is whole: with inter-node links shared by k
// ranks, k times the rank's own inter-node bytes over the link (the ranks
// of a node move about as much each).
double EstimatedTransferSeconds(const HardwareProfile& profile,
                                std::array<int64_t, kNumTiers> send,
                                std::array<int64_t, kNumTiers> recv);

// The backward stages of a pipelined inner level's forward stages [first,
// end) (InnerRank::pipelined: chunks 0..K-1 move in stages first..first+K-1,
// stage first+K moves nothing): the same K/V transfers and items, and the
// dK/dV returns of chunk c, complete once stage c + 1 has computed its
// items, ride stage c + 2's exchange beside its K/V (sorted by peer, then
// payload); those of chunk K - 2 ride the last stage's exchange and those of
// chunk K - 1 its return phase.
void AppendBackwardPipelined(const std::vector<Stage>& fwd, size_t first, size_t end,
                             int64_t ratio, std::vector<Stage>* bwd);

// A pipelined inner level's stages [first, end) of one rank, as the home
// items' schedule sees them (per pass): seconds each stage must take
// whatever the home items do (its transfer, or the items on the previous
// chunk it computes, the larger), and the backward's return phase
// (transfers as EstimatedTransferSeconds gives them).
struct PipelineNeeds {
  std::array<std::vector<double>, 2> stage_s;  // [backward][s - first]
  double return_s = 0;                         // the last backward stage's returns
  // Lower bounds of this rank's inner level in the one-stage plan of the
  // same level (BuildPlan skips building it when the pipelined plan is
  // faster than its bound): forward max(x, home) + received; backward
  // received + max(x + returns, home) (its split of the home items cannot
  // do better), x and the returns at the rank's own bytes.
  std::array<double, 2> one_stage_s{};
};

PipelineNeeds NeedsOf(const HardwareProfile& profile, int64_t head_dim, const RankBytes& rb,
                      size_t first, size_t end,
                      const std::vector<std::array<int64_t, 2>>& inner_area,
                      const RankPlan& rp);

// Spreads a pipelined inner level's home items (all in the overlap list of
// stage `first`, forward and backward, as BuildInnerLevel lays them out)
// over the level's stages [first, end). Stages count their slowest rank
// (cost_model.h), so `level` (the slowest rank's PipelineNeeds, per stage)
// is time every rank has anyway: each stage takes home items until its
// compute reaches the level (the forward from the end of the list, the
// backward from the front; stage `first` and, backward, the return phase
// first), and what is left computes where no chunk does: the forward's
// first stage, the backward's return phase. Returns each pass's areas per
// stage of rp {overlap_items, items, return_overlap_items} for the model.
std::array<std::vector<std::array<int64_t, 3>>, 2> ScheduleHomeItems(
    const HardwareProfile& profile, int64_t head_dim, const PipelineNeeds& level, size_t first,
    size_t end, const std::vector<std::array<int64_t, 2>>& inner_area, RankPlan* rp);

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_PIPELINED_LEVEL_H_

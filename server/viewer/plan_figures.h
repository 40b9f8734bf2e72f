// The figures of a plan page (plan_page.h), computed from a compiled plan:
// what the plan's statistics do not hold directly — received bytes by link
// tier from the transfers, rank x rank and node x node traffic, the modeled
// time of every stage of every rank, the inter-node exact need of every
// node — and the rows a page shows (ranks, or nodes above 64 ranks).
//
// Pure functions of the plan: no I/O, deterministic. The stage times repeat
// the cost model's arithmetic (server/plan/cost_model.h) stage by stage, so
// their sums equal the plan's modeled times; plan_figures_test checks that.
//
// Example:
//   const std::vector<TierSplit> tiers = ReceivedBytesByTier(plan);
//   absl::StatusOr<Timeline> timeline = ModelTimeline(plan);
#ifndef HSAP_SERVER_VIEWER_PLAN_FIGURES_H_
#define HSAP_SERVER_VIEWER_PLAN_FIGURES_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/plan/plan.h"

namespace hsap::viewer {

// Pages show at most this many rows (ranks, nodes or runs of nodes).
inline constexpr int32_t kMaxRows = 64;

// Bytes one rank receives by link tier (plan::LinkTier order: intra-node,
// inter-node), forward and backward (the backward's dK/dV returns included).
struct TierSplit {
  std::array<int64_t, plan::kNumTiers> fwd{};
  std::array<int64_t, plan::kNumTiers> bwd{};
};

// Per rank, in rank order. The one place that decides which tier a byte
// crossed: a transfer between ranks on different nodes (rank r lives on
// node r / devices_per_node) is inter-node. Computed from the plan's
// transfers, so it holds for every strategy; equal to RankStats'
// {fwd,bwd}_recv_bytes by tier (plan_figures_test).
std::vector<TierSplit> ReceivedBytesByTier(const plan::Plan& plan);

// Bytes moved between `size` units (ranks or nodes): fwd[src * size + dst]
// is what src sends dst in the forward plan (every payload), bwd the same
// for the backward plan (its transfers and dK/dV returns).
struct TrafficMatrix {
  int32_t size = 0;
  std::vector<int64_t> fwd;
  std::vector<int64_t> bwd;
};
// REQUIRES: plan.ranks.size() <= 4096 (the matrix is dense).
TrafficMatrix RankTraffic(const plan::Plan& plan);
TrafficMatrix NodeTraffic(const plan::Plan& plan);

// The modeled time of one stage of one rank, microseconds (cost_model.h):
// the stage takes max(transfer, overlap) + compute + max(returns,
// return_overlap).
struct StageTime {
  double transfer_us = 0;  // the transfer term: both tiers in parallel
  // The transfer term's tier, the slower of the two (plan::LinkTier); only
  // meaningful when transfer_us > 0.
  plan::LinkTier transfer_tier = plan::LinkTier::kIntraNode;
  double overlap_us = 0;  // overlap_items, run while the transfers are in flight
  double compute_us = 0;  // items, after the transfers
  double return_us = 0;   // backward: the dK/dV partials sent back
  double return_overlap_us = 0;  // backward: return_overlap_items, run while they fly
  double total_us() const;
};

struct Timeline {
  // [rank][stage].
  std::vector<std::vector<StageTime>> fwd;
  std::vector<std::vector<StageTime>> bwd;
  // Per stage, the slowest rank's total: stages are collective steps, so
  // stage s starts when every rank finished stage s - 1, and the sums are
  // PlanStats::fwd_us / bwd_us.
  std::vector<double> fwd_stage_us;
  std::vector<double> bwd_stage_us;
};
// INVALID_ARGUMENT when the plan's profile does not parse
// (plan::ParseHardwareProfile's message).
absl::StatusOr<Timeline> ModelTimeline(const plan::Plan& plan);

// The floors a layer's modeled time is compared with.
struct Floors {
  // The busiest rank's modeled compute (RankStats::{fwd,bwd}_compute_us).
  double fwd_compute_us = 0;
  double bwd_compute_us = 0;
  // Per node: the K/V bytes (all heads) of the tokens its queries see that
  // no rank of the node holds (DESIGN.md §8, inter-node exact need).
  std::vector<int64_t> node_inter_need_bytes;
  // The busiest node's inter-node need at the node's inter-node bandwidth
  // (devices_per_node x the profile's per-rank rate): no plan of this
  // assignment moves its K/V across nodes faster, forward, nor backward
  // (which moves them again). 0 on one node or with no profile.
  double inter_need_us = 0;
  // PlanStats::lower_bound_us (forward + backward).
  double plan_lower_bound_us = 0;
};
Floors ComputeFloors(const plan::Plan& plan);

// The K/V bytes each node must receive from other nodes (Floors::
// node_inter_need_bytes), from the plan's mask and assignment.
std::vector<int64_t> InterNodeExactNeedBytes(const plan::Plan& plan);

// The rows of a page: each a run of consecutive ranks [first_rank,
// last_rank]. Ranks when there are at most kMaxRows of them; else nodes
// when at most kMaxRows; else runs of ceil(nodes / kMaxRows) nodes.
struct Row {
  int32_t first_rank = 0;
  int32_t last_rank = 0;
  int32_t first_node = 0;
  int32_t last_node = 0;
  std::string label;  // "rank 5", "node 3", "nodes 8-15"
};
enum class RowLevel { kRank, kNode, kNodeRun };
struct Rows {
  RowLevel level = RowLevel::kRank;
  std::vector<Row> rows;
};
Rows PageRows(const plan::Topology& topology);

// `matrix` (of ranks, or of nodes when from_nodes) summed into rows x rows.
TrafficMatrix GroupTraffic(const TrafficMatrix& matrix, const Rows& rows, bool from_nodes);

// Per row and stage bin, the component-wise maximum over the row's ranks
// of each stage's terms, summed over the stages of the bin: a row's bar is
// its slowest rank's, stage by stage. Stage bins are runs of
// `stages_per_bin` consecutive stages (1: every stage its own bin).
struct BinnedTimeline {
  int32_t stages_per_bin = 1;
  int32_t num_stages = 0;
  std::vector<double> bin_start_us;  // when each bin's first stage starts
  std::vector<double> bin_us;        // sum of the bin's stages' slowest totals
  // [row][bin]: transfer_us, overlap_us, compute_us, return_us, the
  // bin's inter-node share of the transfer time in [0, 1], and
  // return_overlap_us.
  std::vector<std::vector<std::array<double, 6>>> cells;
};
BinnedTimeline BinTimeline(const std::vector<std::vector<StageTime>>& per_rank,
                           const std::vector<double>& stage_us, const Rows& rows,
                           int32_t max_bins);

}  // namespace hsap::viewer

#endif  // HSAP_SERVER_VIEWER_PLAN_FIGURES_H_

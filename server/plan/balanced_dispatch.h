// Internal to dispatch.cc: the `balanced` assignment solver.
//
// Goal (DESIGN.md §5): every rank holds exactly floor(T/P) or ceil(T/P)
// tokens; the causal area per rank is balanced; short documents stay whole;
// long ones are split over as few ranks as balance allows, so the exact-need
// communication stays small; on several nodes, a document stays inside one
// node when it fits there, so that only what no node can hold crosses the
// inter-node links.
//
// Method (one placement problem: bins with token quotas). Documents (or
// groups of slices with overlapping rows) longer than a piece size are cut
// into pieces of that many tokens; whole documents and pieces are placed
// heaviest first (LPT). Among a few candidate bins with room (the
// document's current holders, the least-loaded, the least-needy) whose
// projected final area (area so far + the item + the rest of the room at
// the mean density still to place) stays within the mean plus a slack, an
// item goes where it adds the least exact need (a bin already holding
// later tokens of the document needs nothing more); otherwise to the
// least-loaded bin with room. An item no bin has room for fills the
// least-loaded bins. Piece sizes of a quota, 1/2, ... 1/32 of it (coarse to
// fine, stopping one level after the first balanced attempt) and two slacks
// are tried; among the attempts with area imbalance <= the goal the one
// whose busiest bin has the least exact need (DESIGN.md §8) wins, else the
// most balanced. A piece size whose heaviest item alone exceeds the goal is
// not tried unless nothing else balances. Cost: O(attempts * items * log
// bins) plus an exact-need evaluation per balanced attempt.
//
// One node: the bins are the ranks. Several nodes (hierarchical): first the
// bins are the nodes (each node's quota its ranks' quotas, the goal
// kNodeImbalanceGoal, a node's exact need its inter-node need: among the
// balanced attempts the one whose busiest node needs least wins), then each
// node's tokens are placed on its ranks the same way (pieces cut only
// inside the node), to the rank goal over the whole group: the ranks of a
// node f times as loaded as the mean node are balanced to goal / f.
#ifndef HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_
#define HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/mask.h"
#include "common/thread_pool.h"
#include "server/plan/token_range.h"

namespace hsap::plan::internal {

// Per rank, its token ranges (sorted, merged). Ranks r and r' share a node
// when r / ranks_per_node == r' / ranks_per_node; ranks_per_node <= 0 or
// >= ranks (or not dividing ranks) is one node. The two slacks of a level,
// the exact-need evaluation and the nodes' rank placements run over `pool`
// when set (same result).
// REQUIRES: slices sorted by q_begin, non-overlapping, within [0, total);
// ranks >= 1.
std::vector<std::vector<TokenRange>> BalancedRanges(absl::Span<const MaskSlice> slices,
                                                    int64_t total, int32_t ranks,
                                                    int32_t ranks_per_node = 0,
                                                    ThreadPool* pool = nullptr);

// The area imbalance the solver accepts without looking for a more balanced
// cutting (over ranks).
inline constexpr double kBalancedImbalanceGoal = 1.04;
// The same over nodes, when placing documents on nodes first. Not tighter:
// the ranks of a node f times as loaded as the mean are balanced to
// kBalancedImbalanceGoal / f, so the heaviest node's ranks end as even as
// its area allows (16 x 8, T = 1M, python-stdlib: a node goal of 1.02
// left hsap's busiest link 26 % more inter-node bytes at rank imbalance
// 1.020 against 1.040; docs/results/scale_sim.md).
inline constexpr double kNodeImbalanceGoal = 1.04;

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_

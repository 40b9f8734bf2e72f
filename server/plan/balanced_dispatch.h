// Internal to dispatch.cc: the `balanced` assignment solver.
//
// Goal (DESIGN.md §5): every rank holds exactly floor(T/P) or ceil(T/P)
// tokens; the causal area per rank is balanced; short documents stay whole;
// long ones are split over as few ranks as balance allows, so the exact-need
// communication stays small.
//
// Method. Documents (or groups of slices with overlapping rows) longer than
// a piece size are cut into pieces of that many tokens; whole documents and
// pieces are placed heaviest first (LPT). Among a few candidate ranks with
// room (the document's current holders, the least-loaded, the least-needy)
// whose projected final area (area so far + the item + the rest of the room
// at the mean density still to place) stays within the mean plus a slack, an
// item goes where it adds the least exact need (a rank already holding later
// tokens of the document needs nothing more); otherwise to the least-loaded
// rank with room. An item no rank has room for fills the least-loaded ranks.
// Piece sizes of a quota, 1/2, ... 1/32 of it (coarse to fine, stopping one
// level after the first balanced attempt) and two slacks are tried; among
// the attempts with area imbalance <= kBalancedImbalanceGoal the one whose
// busiest rank has the least exact need (DESIGN.md §8) wins, else the most
// balanced. A piece size whose heaviest item alone exceeds the goal is not
// tried unless nothing else balances. Cost: O(attempts * items * log P) plus
// an exact-need evaluation per balanced attempt.
#ifndef HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_
#define HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/mask.h"
#include "common/thread_pool.h"
#include "server/plan/token_range.h"

namespace hsap::plan::internal {

// Per rank, its token ranges (sorted, merged). The two slacks of a level
// and the exact-need evaluation run over `pool` when set (same result).
// REQUIRES: slices sorted by q_begin, non-overlapping, within [0, total);
// ranks >= 1.
std::vector<std::vector<TokenRange>> BalancedRanges(absl::Span<const MaskSlice> slices,
                                                    int64_t total, int32_t ranks,
                                                    ThreadPool* pool = nullptr);

// The area imbalance the solver accepts without looking for a more balanced
// cutting.
inline constexpr double kBalancedImbalanceGoal = 1.04;

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_BALANCED_DISPATCH_H_

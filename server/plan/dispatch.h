// Assignment of global tokens to ranks (DESIGN.md §5, "Dispatch").
//
// A Dispatch lists, for each rank, the sorted global token ranges it holds
// (its Q, K, V and O rows). A rank stores its tokens in assignment order:
// its ranges concatenated; that order is the rank's *local row* index space.
//
// Policies:
//  * contiguous: rank r holds [r T / P, (r + 1) T / P).
//  * zigzag:     the sequence is cut into 2P chunks; rank r holds chunks r
//                and 2P - 1 - r (balances one long causal sequence).
//  * balanced:   sequence-aware (MagiAttention's dispatch solver is the
//                model): documents whose area or length exceeds a rank's
//                share are split into contiguous, area-balanced parts over as
//                few ranks as balance allows; the other documents stay whole.
//                Parts and documents go to the rank with the least expected
//                area that has room, so every rank holds exactly floor(T/P)
//                or ceil(T/P) tokens and the causal area is balanced. On
//                several nodes, documents go to nodes first (a document that
//                fits in a node stays inside it), then to the node's ranks.
// All three run in O(documents log documents + P * items) without touching
// individual tokens.
#ifndef HSAP_SERVER_PLAN_DISPATCH_H_
#define HSAP_SERVER_PLAN_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/mask.h"
#include "common/thread_pool.h"
#include "server/plan/plan_spec.h"
#include "server/plan/token_range.h"

namespace hsap::plan {

struct Dispatch {
  int64_t total_tokens = 0;
  // ranges[r]: rank r's global token ranges, sorted, disjoint, non-adjacent.
  std::vector<std::vector<TokenRange>> ranges;

  int32_t num_ranks() const { return static_cast<int32_t>(ranges.size()); }
  int64_t TokensOf(int32_t rank) const { return TotalTokens(ranges[rank]); }
  bool operator==(const Dispatch& o) const {
    return total_tokens == o.total_tokens && ranges == o.ranges;
  }
};

// Computes the assignment of `total_tokens` tokens to `num_ranks` ranks.
// `slices` is the resolved mask (ResolveSlices); only `balanced` reads it,
// and spreads its attempts over `pool` when set (same result without).
// REQUIRES: num_ranks >= 1, slices valid and non-overlapping.
Dispatch ComputeDispatch(AssignmentPolicy policy, absl::Span<const MaskSlice> slices,
                         int64_t total_tokens, int32_t num_ranks, ThreadPool* pool = nullptr);
// The same on `topology`'s ranks: `balanced` on several nodes places
// documents on nodes first (balanced_dispatch.h); one node gives exactly
// the dispatch above.
Dispatch ComputeDispatch(AssignmentPolicy policy, absl::Span<const MaskSlice> slices,
                         int64_t total_tokens, const Topology& topology,
                         ThreadPool* pool = nullptr);

// Where a global token lives: segments sorted by global position, each a run
// of tokens held by one rank at consecutive local rows.
struct OwnerSegment {
  int64_t begin = 0;  // global
  int64_t end = 0;
  int32_t rank = 0;
  int64_t local_row = 0;  // local row of `begin` on `rank`
};

// Sorted owner segments covering [0, total_tokens) (when the dispatch is a
// partition, which ComputeDispatch guarantees).
std::vector<OwnerSegment> BuildOwnerMap(const Dispatch& dispatch);

// Checks that `dispatch` partitions [0, total_tokens) with sorted, disjoint
// ranges per rank; INVALID_ARGUMENT naming the rank and range otherwise.
absl::Status ValidateDispatch(const Dispatch& dispatch);

// Area of rows [begin, end) of the mask, i.e. the number of allowed (q, k)
// pairs with q in the rows: sum of SliceArea over clipped slices. `slices`
// sorted by q_begin. O(slices overlapping the rows + log slices).
int64_t RowArea(absl::Span<const MaskSlice> slices, int64_t begin, int64_t end);

// The slice restricted to query rows [begin, end) (clipped to its own rows),
// with the causal offset adjusted so the allowed pairs are unchanged.
MaskSlice ClipRows(const MaskSlice& s, int64_t begin, int64_t end);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_DISPATCH_H_

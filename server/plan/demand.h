// What each rank's queries need: interval arithmetic over mask slices.
//
// A Demand is one block of need: query rows [q_begin, q_end) (global, held at
// home row q_row) of slice `slice` see keys in [k_begin, k_end) (global), and
// every key of that interval is seen by at least one of the rows. Demands of
// a set of rows partition the allowed (q, k) pairs of those rows by slice and
// row run, so a plan that computes, per demand, each key of its interval
// exactly once computes every allowed pair exactly once.
#ifndef HSAP_SERVER_PLAN_DEMAND_H_
#define HSAP_SERVER_PLAN_DEMAND_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/mask.h"
#include "server/plan/dispatch.h"
#include "server/plan/token_range.h"

namespace hsap::plan {

struct Demand {
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int64_t q_row = 0;
  int64_t k_begin = 0;
  int64_t k_end = 0;
  int32_t slice = 0;
};

// Keys (global) seen by at least one row of `s`: one interval, because the
// per-row key ranges of a slice move monotonically and overlap (DESIGN.md
// §2 rule). Empty TokenRange when no row sees a key.
TokenRange KeysSeen(const MaskSlice& s);

// The rows of `s` (global, a sub-range of its query rows) that see at least
// one key in the global key interval [k_begin, k_end).
TokenRange RowsSeeing(const MaskSlice& s, int64_t k_begin, int64_t k_end);

// The slice with query rows [q_begin, q_end) and key range [k_begin, k_end)
// cut out of `s` (offset adjusted so the allowed pairs are unchanged).
MaskSlice SubSlice(const MaskSlice& s, int64_t q_begin, int64_t q_end, int64_t k_begin,
                   int64_t k_end);

// Index for finding the slices whose query rows overlap a row range.
// REQUIRES: slices sorted by q_begin (ResolveSlices).
class SliceIndex {
 public:
  explicit SliceIndex(absl::Span<const MaskSlice> slices);
  // Calls f(slice_index) for every slice with rows overlapping [begin, end).
  template <typename F>
  void ForEachOverlapping(int64_t begin, int64_t end, F&& f) const {
    // First slice whose prefix-max q_end exceeds begin.
    size_t i = static_cast<size_t>(
        std::upper_bound(prefix_max_q_end_.begin(), prefix_max_q_end_.end(), begin) -
        prefix_max_q_end_.begin());
    for (; i < slices_.size() && slices_[i].q_begin < end; ++i) {
      if (slices_[i].q_end > begin) f(i);
    }
  }
  absl::Span<const MaskSlice> slices() const { return slices_; }

 private:
  absl::Span<const MaskSlice> slices_;
  std::vector<int64_t> prefix_max_q_end_;
};

// Demands of the rows in `home` (global runs with their home rows), sorted
// by (k_begin, q_begin).
std::vector<Demand> ComputeDemands(const SliceIndex& index, absl::Span<const OwnerSegment> home);

// Exact need: the keys the rows in `home` see that are not among those rows
// (DESIGN.md §8), as sorted disjoint ranges.
std::vector<TokenRange> ExactNeed(absl::Span<const Demand> demands,
                                  absl::Span<const OwnerSegment> home);

// Per node of `topology` (ranks r / devices_per_node), its inter-node exact
// need (DESIGN.md §8) in tokens: the keys its rows see that no rank of the
// node holds. All zero on one node.
std::vector<int64_t> NodeInterNeedTokens(const SliceIndex& index, const Dispatch& dispatch,
                                         const Topology& topology);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_DEMAND_H_

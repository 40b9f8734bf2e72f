#include "server/plan/demand.h"

#include <algorithm>
#include <tuple>

namespace hsap::plan {

TokenRange KeysSeen(const MaskSlice& s) {
  const int64_t nq = s.num_q(), nk = s.num_k();
  if (nq <= 0 || nk <= 0) return {};
  if (s.type == MaskType::kFull) return {s.k_begin, s.k_end};
  // Row r sees a key iff r + offset >= 0 and (no window or r + offset -
  // window < nk); such rows form one run [first, last).
  const int64_t first = std::max<int64_t>(0, -s.offset);
  int64_t last = nq;
  if (s.window >= 0) last = std::min(last, nk + s.window - s.offset);
  if (first >= last) return {};
  int64_t lo, hi, lo2, hi2;
  RowKeyRange(s.type, s.offset, s.window, nk, first, &lo, &hi);
  RowKeyRange(s.type, s.offset, s.window, nk, last - 1, &lo2, &hi2);
  return {s.k_begin + lo, s.k_begin + hi2};
}

TokenRange RowsSeeing(const MaskSlice& s, int64_t k_begin, int64_t k_end) {
  const int64_t x = std::max(k_begin, s.k_begin) - s.k_begin;
  const int64_t y = std::min(k_end, s.k_end) - s.k_begin;
  if (x >= y || s.num_q() <= 0) return {s.q_begin, s.q_begin};
  if (s.type == MaskType::kFull) return {s.q_begin, s.q_end};
  // Row r sees key j iff 0 <= r + offset - j (<= window): some j in [x, y)
  // iff r >= x - offset and (no window or r <= y - 1 + window - offset).
  int64_t first = std::max<int64_t>(0, x - s.offset);
  int64_t last = s.num_q();
  if (s.window >= 0) last = std::min(last, y + s.window - s.offset);
  if (first >= last) return {s.q_begin, s.q_begin};
  return {s.q_begin + first, s.q_begin + last};
}

MaskSlice SubSlice(const MaskSlice& s, int64_t q_begin, int64_t q_end, int64_t k_begin,
                   int64_t k_end) {
  MaskSlice c = s;
  c.q_begin = q_begin;
  c.q_end = q_end;
  c.k_begin = k_begin;
  c.k_end = k_end;
  if (s.type == MaskType::kCausal) {
    c.offset = s.offset + (q_begin - s.q_begin) - (k_begin - s.k_begin);
  }
  return c;
}

SliceIndex::SliceIndex(absl::Span<const MaskSlice> slices) : slices_(slices) {
  prefix_max_q_end_.reserve(slices.size());
  int64_t m = INT64_MIN;
  for (const MaskSlice& s : slices) {
    m = std::max(m, s.q_end);
    prefix_max_q_end_.push_back(m);
  }
}

std::vector<Demand> ComputeDemands(const SliceIndex& index,
                                   absl::Span<const OwnerSegment> home) {
  std::vector<Demand> out;
  const auto slices = index.slices();
  for (const OwnerSegment& seg : home) {
    index.ForEachOverlapping(seg.begin, seg.end, [&](size_t i) {
      const MaskSlice& s = slices[i];
      const int64_t a = std::max(seg.begin, s.q_begin), b = std::min(seg.end, s.q_end);
      const MaskSlice rows = SubSlice(s, a, b, s.k_begin, s.k_end);
      const TokenRange keys = KeysSeen(rows);
      if (keys.empty()) return;
      // Trim the rows to those that see any key.
      const TokenRange seeing = RowsSeeing(rows, keys.begin, keys.end);
      out.push_back({seeing.begin, seeing.end, seg.local_row + (seeing.begin - seg.begin),
                     keys.begin, keys.end, static_cast<int32_t>(i)});
    });
  }
  std::sort(out.begin(), out.end(), [](const Demand& a, const Demand& b) {
    return std::tie(a.k_begin, a.q_begin, a.slice) < std::tie(b.k_begin, b.q_begin, b.slice);
  });
  return out;
}

std::vector<TokenRange> ExactNeed(absl::Span<const Demand> demands,
                                  absl::Span<const OwnerSegment> home) {
  std::vector<TokenRange> keys;
  keys.reserve(demands.size());
  for (const Demand& d : demands) keys.push_back({d.k_begin, d.k_end});
  keys = Normalize(std::move(keys));
  std::vector<TokenRange> own;
  own.reserve(home.size());
  for (const OwnerSegment& s : home) own.push_back({s.begin, s.end});
  own = Normalize(std::move(own));
  // keys minus own, both sorted and disjoint.
  std::vector<TokenRange> out;
  size_t j = 0;
  for (TokenRange k : keys) {
    while (j < own.size() && own[j].end <= k.begin) ++j;
    size_t jj = j;
    int64_t cursor = k.begin;
    while (jj < own.size() && own[jj].begin < k.end) {
      if (own[jj].begin > cursor) out.push_back({cursor, own[jj].begin});
      cursor = std::max(cursor, own[jj].end);
      ++jj;
    }
    if (cursor < k.end) out.push_back({cursor, k.end});
  }
  return out;
}

std::vector<int64_t> NodeInterNeedTokens(const SliceIndex& index, const Dispatch& dispatch,
                                         const Topology& topology) {
  std::vector<int64_t> need(topology.num_nodes, 0);
  if (topology.num_nodes <= 1) return need;
  for (int32_t n = 0; n < topology.num_nodes; ++n) {
    std::vector<TokenRange> rows;
    for (int32_t r = n * topology.devices_per_node;
         r < (n + 1) * topology.devices_per_node && r < dispatch.num_ranks(); ++r) {
      rows.insert(rows.end(), dispatch.ranges[r].begin(), dispatch.ranges[r].end());
    }
    std::vector<OwnerSegment> held;
    int64_t row = 0;
    for (const TokenRange& t : Normalize(std::move(rows))) {
      held.push_back({t.begin, t.end, n, row});
      row += t.size();
    }
    need[n] = TotalTokens(ExactNeed(ComputeDemands(index, held), held));
  }
  return need;
}

}  // namespace hsap::plan

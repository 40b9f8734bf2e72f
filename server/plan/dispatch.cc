#include "server/plan/dispatch.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "server/plan/balanced_dispatch.h"

namespace hsap::plan {
MaskSlice ClipRows(const MaskSlice& s, int64_t begin, int64_t end) {
  MaskSlice c = s;
  c.q_begin = std::max(s.q_begin, begin);
  c.q_end = std::min(s.q_end, end);
  if (c.q_end < c.q_begin) c.q_end = c.q_begin;
  if (s.type == MaskType::kCausal) c.offset = s.offset + (c.q_begin - s.q_begin);
  return c;
}

int64_t RowArea(absl::Span<const MaskSlice> slices, int64_t begin, int64_t end) {
  int64_t a = 0;
  for (const MaskSlice& s : slices) {
    if (s.q_begin >= end) break;
    if (s.q_end <= begin) continue;
    a += SliceArea(ClipRows(s, begin, end));
  }
  return a;
}

Dispatch ComputeDispatch(AssignmentPolicy policy, absl::Span<const MaskSlice> slices,
                         int64_t total_tokens, int32_t num_ranks, ThreadPool* pool) {
  return ComputeDispatch(policy, slices, total_tokens, Topology{1, num_ranks}, pool);
}

Dispatch ComputeDispatch(AssignmentPolicy policy, absl::Span<const MaskSlice> slices,
                         int64_t total_tokens, const Topology& topology, ThreadPool* pool) {
  const int32_t num_ranks = topology.num_ranks();
  Dispatch d;
  d.total_tokens = total_tokens;
  d.ranges.assign(num_ranks, {});
  const int64_t T = total_tokens;
  switch (policy) {
    case AssignmentPolicy::kContiguous:
      for (int32_t r = 0; r < num_ranks; ++r) {
        const TokenRange range{T * r / num_ranks, T * (r + 1) / num_ranks};
        if (!range.empty()) d.ranges[r].push_back(range);
      }
      return d;
    case AssignmentPolicy::kZigzag: {
      const int64_t chunks = 2 * int64_t{num_ranks};
      auto chunk = [&](int64_t c) { return TokenRange{T * c / chunks, T * (c + 1) / chunks}; };
      for (int32_t r = 0; r < num_ranks; ++r) {
        d.ranges[r] = Normalize({chunk(r), chunk(chunks - 1 - r)});
      }
      return d;
    }
    case AssignmentPolicy::kBalanced:
      d.ranges = internal::BalancedRanges(
          slices, T, num_ranks, topology.num_nodes > 1 ? topology.devices_per_node : 0, pool);
      return d;
  }
  return d;
}

std::vector<OwnerSegment> BuildOwnerMap(const Dispatch& dispatch) {
  std::vector<OwnerSegment> out;
  for (int32_t r = 0; r < dispatch.num_ranks(); ++r) {
    int64_t row = 0;
    for (const TokenRange& t : dispatch.ranges[r]) {
      if (t.empty()) continue;
      out.push_back({t.begin, t.end, r, row});
      row += t.size();
    }
  }
  std::sort(out.begin(), out.end(),
            [](const OwnerSegment& a, const OwnerSegment& b) { return a.begin < b.begin; });
  return out;
}

absl::Status ValidateDispatch(const Dispatch& dispatch) {
  for (int32_t r = 0; r < dispatch.num_ranks(); ++r) {
    const auto& rs = dispatch.ranges[r];
    for (size_t i = 0; i < rs.size(); ++i) {
      if (rs[i].begin < 0 || rs[i].end <= rs[i].begin || rs[i].end > dispatch.total_tokens) {
        return absl::InvalidArgumentError(
            absl::StrCat("dispatch.ranges[", r, "][", i, "] = [", rs[i].begin, ", ", rs[i].end,
                         ") is empty or outside [0, ", dispatch.total_tokens, ")"));
      }
      if (i > 0 && rs[i].begin < rs[i - 1].end) {
        return absl::InvalidArgumentError(absl::StrCat("dispatch.ranges[", r, "][", i,
                                                       "] begins at ", rs[i].begin,
                                                       " before the previous range ends at ",
                                                       rs[i - 1].end));
      }
    }
  }
  std::vector<OwnerSegment> owners = BuildOwnerMap(dispatch);
  int64_t cursor = 0;
  for (const OwnerSegment& s : owners) {
    if (s.begin != cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dispatch: token ", std::min(cursor, s.begin), " is ",
          s.begin > cursor ? "held by no rank" : "held by two ranks", " (rank ", s.rank, ")"));
    }
    cursor = s.end;
  }
  if (cursor != dispatch.total_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch covers [0, ", cursor, ") but ",
                                                   dispatch.total_tokens, " tokens exist"));
  }
  return absl::OkStatus();
}

}  // namespace hsap::plan

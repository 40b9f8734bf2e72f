// Half-open ranges of global token positions and small helpers over sorted
// lists of them. Everything the planner computes about "which tokens" is
// interval arithmetic over these lists, never per token.
#ifndef HSAP_SERVER_PLAN_TOKEN_RANGE_H_
#define HSAP_SERVER_PLAN_TOKEN_RANGE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hsap::plan {

// [begin, end) of global token positions.
struct TokenRange {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const TokenRange& o) const { return begin == o.begin && end == o.end; }
  bool operator<(const TokenRange& o) const {
    return begin != o.begin ? begin < o.begin : end < o.end;
  }
};

// Total tokens of a list.
inline int64_t TotalTokens(const std::vector<TokenRange>& ranges) {
  int64_t n = 0;
  for (const TokenRange& r : ranges) n += r.size();
  return n;
}

// Sorts, drops empty ranges and merges overlapping or adjacent ones.
inline std::vector<TokenRange> Normalize(std::vector<TokenRange> ranges) {
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const TokenRange& r) { return r.empty(); }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end());
  std::vector<TokenRange> out;
  for (const TokenRange& r : ranges) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_TOKEN_RANGE_H_

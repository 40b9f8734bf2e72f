#include "server/plan/dispatch.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace hsap::plan {
namespace {

// Quota of rank r: floor(T / P) plus one for the first T % P ranks.
int64_t Quota(int64_t total, int32_t ranks, int32_t r) {
  return total / ranks + (r < total % ranks ? 1 : 0);
}

// A unit of the balanced solver: a run of query rows [begin, end) whose
// slices are slices[first_slice, last_slice) (documents: one slice each;
// rows no slice covers: none).
struct Unit {
  int64_t begin = 0;
  int64_t end = 0;
  size_t first_slice = 0;
  size_t last_slice = 0;
  int64_t area = 0;
};

int64_t UnitPrefixArea(absl::Span<const MaskSlice> slices, const Unit& u, int64_t x) {
  int64_t a = 0;
  for (size_t i = u.first_slice; i < u.last_slice; ++i) {
    a += SliceArea(ClipRows(slices[i], slices[i].q_begin, x));
  }
  return a;
}

// Groups slices with overlapping query rows into units, and fills the rows
// no slice covers with area-0 units.
std::vector<Unit> BuildUnits(absl::Span<const MaskSlice> slices, int64_t total) {
  std::vector<Unit> units;
  int64_t cursor = 0;
  size_t i = 0;
  while (i < slices.size()) {
    Unit u;
    u.begin = slices[i].q_begin;
    u.end = slices[i].q_end;
    u.first_slice = i;
    ++i;
    while (i < slices.size() && slices[i].q_begin < u.end) {
      u.end = std::max(u.end, slices[i].q_end);
      ++i;
    }
    u.last_slice = i;
    if (u.begin > cursor) units.push_back({cursor, u.begin, 0, 0, 0});
    for (size_t j = u.first_slice; j < u.last_slice; ++j) u.area += SliceArea(slices[j]);
    units.push_back(u);
    cursor = u.end;
  }
  if (cursor < total) units.push_back({cursor, total, 0, 0, 0});
  return units;
}

struct Item {
  std::vector<TokenRange> ranges;  // one run, or two for a zigzag pair
  int64_t tokens = 0;
  int64_t area = 0;
  int64_t unit = 0;  // parts of one unit go to distinct ranks
  bool part = false;
};

// A plain causal document (one CAUSAL slice, diagonal at the top left, no
// window): its area per row grows linearly, so pairing chunk i with chunk
// 2k - 1 - i gives k parts of equal tokens and equal area.
bool IsPlainCausal(absl::Span<const MaskSlice> slices, const Unit& u) {
  if (u.last_slice - u.first_slice != 1) return false;
  const MaskSlice& s = slices[u.first_slice];
  return s.type == MaskType::kCausal && s.offset == 0 && s.window < 0 &&
         s.q_begin == s.k_begin && s.q_end == s.k_end;
}

// Splits unit u into about k parts, each at most cap_max tokens.
void SplitUnit(absl::Span<const MaskSlice> slices, const Unit& u, int64_t ui, int64_t k,
               int64_t cap_max, std::vector<Item>* items) {
  const int64_t len = u.end - u.begin;
  auto area_of = [&](int64_t a, int64_t b) {
    return UnitPrefixArea(slices, u, b) - UnitPrefixArea(slices, u, a);
  };
  if (IsPlainCausal(slices, u) && len >= 2 * k) {
    const int64_t chunks = 2 * k;
    auto cut = [&](int64_t c) { return u.begin + len * c / chunks; };
    for (int64_t i = 0; i < k; ++i) {
      Item it;
      it.ranges = {{cut(i), cut(i + 1)}, {cut(chunks - 1 - i), cut(chunks - i)}};
      it.tokens = TotalTokens(it.ranges);
      it.area = area_of(cut(i), cut(i + 1)) + area_of(cut(chunks - 1 - i), cut(chunks - i));
      it.unit = ui;
      it.part = true;
      items->push_back(std::move(it));
    }
    return;
  }
  // Contiguous, area-balanced cuts: each part aims at an equal share of the
  // area still to place, capped at cap_max tokens.
  int64_t x = u.begin;
  int64_t left_area = u.area;
  for (int64_t p = 0; x < u.end; ++p) {
    const int64_t parts_left = std::max<int64_t>(1, k - p);
    int64_t next = u.end;
    if (parts_left > 1) {
      if (u.area > 0) {
        const int64_t target = UnitPrefixArea(slices, u, x) + left_area / parts_left;
        int64_t lo = x + 1, hi = u.end;  // smallest cut with prefix area >= target
        while (lo < hi) {
          const int64_t mid = lo + (hi - lo) / 2;
          if (UnitPrefixArea(slices, u, mid) >= target) {
            hi = mid;
          } else {
            lo = mid + 1;
          }
        }
        next = lo;
      } else {
        next = x + (u.end - x) / parts_left;
      }
    }
    next = std::min(next, x + cap_max);
    if (next <= x) next = std::min(u.end, x + 1);
    Item it;
    it.ranges = {{x, next}};
    it.tokens = next - x;
    it.area = area_of(x, next);
    it.unit = ui;
    it.part = true;
    left_area -= it.area;
    items->push_back(std::move(it));
    x = next;
  }
}

Dispatch Balanced(absl::Span<const MaskSlice> slices, int64_t total, int32_t ranks) {
  Dispatch d;
  d.total_tokens = total;
  d.ranges.assign(ranks, {});
  std::vector<Unit> units = BuildUnits(slices, total);
  const int64_t cap_min = total / ranks;
  const int64_t cap_max = Quota(total, ranks, 0);
  double area_total = 0;
  for (const Unit& u : units) area_total += static_cast<double>(u.area);
  const double area_share = area_total / ranks;

  // Units that must or should be split: longer than a rank's quota, or
  // carrying more than half a rank's share of area.
  auto is_long = [&](const Unit& u) {
    return u.end - u.begin > cap_min || static_cast<double>(u.area) > 0.5 * area_share;
  };
  double small_area = 0, small_tokens = 0;
  for (const Unit& u : units) {
    if (!is_long(u)) {
      small_area += static_cast<double>(u.area);
      small_tokens += static_cast<double>(u.end - u.begin);
    }
  }
  // Area per token of the filler (whole documents): the area a rank will
  // still collect for each token of free capacity.
  const double rho = small_tokens > 0 ? small_area / small_tokens : 0.0;

  std::vector<Item> items;
  std::vector<Item> small;
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const Unit& u = units[ui];
    const int64_t len = u.end - u.begin;
    if (len == 0) continue;
    if (!is_long(u) || cap_max == 0) {
      Item it;
      it.ranges = {{u.begin, u.end}};
      it.tokens = len;
      it.area = u.area;
      it.unit = static_cast<int64_t>(ui);
      small.push_back(std::move(it));
      continue;
    }
    // Parts k: enough that a part plus its share of filler stays within a
    // rank's area share, and that no part exceeds a quota.
    const double room = area_share - static_cast<double>(cap_min) * rho;
    const double k_area = room > 0 ? (static_cast<double>(u.area) - len * rho) / room
                                    : static_cast<double>(u.area) / std::max(area_share, 1.0);
    int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(k_area - 1e-9)));
    k = std::max<int64_t>(k, (len + cap_max - 1) / cap_max);
    k = std::min<int64_t>(k, ranks);
    SplitUnit(slices, u, static_cast<int64_t>(ui), k, cap_max, &items);
  }
  // Large items first (LPT); ties broken by position for determinism.
  auto by_area = [](const Item& a, const Item& b) {
    return std::make_tuple(-a.area, -a.tokens, a.ranges[0].begin) <
           std::make_tuple(-b.area, -b.tokens, b.ranges[0].begin);
  };
  std::stable_sort(small.begin(), small.end(), by_area);
  // Parts of the largest units first, keeping each unit's parts together.
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    const int64_t ua = units[a.unit].area, ub = units[b.unit].area;
    if (ua != ub) return ua > ub;
    return a.unit < b.unit;
  });
  items.insert(items.end(), small.begin(), small.end());

  std::vector<int64_t> cap(ranks), area(ranks, 0), last_unit(ranks, -1);
  for (int32_t r = 0; r < ranks; ++r) cap[r] = Quota(total, ranks, r);
  auto load = [&](int32_t r) { return static_cast<double>(area[r]) + cap[r] * rho; };
  for (const Item& it : items) {
    int32_t best = -1;
    for (int32_t r = 0; r < ranks; ++r) {
      if (cap[r] < it.tokens || (it.part && last_unit[r] == it.unit)) continue;
      if (best < 0 || load(r) < load(best)) best = r;
    }
    if (best >= 0) {
      for (const TokenRange& t : it.ranges) d.ranges[best].push_back(t);
      cap[best] -= it.tokens;
      area[best] += it.area;
      if (it.part) last_unit[best] = it.unit;
      continue;
    }
    // No rank has room for the whole item: fill the ranks with the most room.
    const Unit& u = units[it.unit];
    const auto unit_slices = slices.subspan(u.first_slice, u.last_slice - u.first_slice);
    for (const TokenRange& t : it.ranges) {
      int64_t x = t.begin;
      while (x < t.end) {
        int32_t r_max = 0;
        for (int32_t r = 1; r < ranks; ++r) {
          if (cap[r] > cap[r_max]) r_max = r;
        }
        const int64_t take = std::min(cap[r_max], t.end - x);
        d.ranges[r_max].push_back({x, x + take});
        cap[r_max] -= take;
        area[r_max] += RowArea(unit_slices, x, x + take);
        x += take;
      }
    }
  }
  for (auto& r : d.ranges) r = Normalize(std::move(r));
  return d;
}

}  // namespace

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
                         int64_t total_tokens, int32_t num_ranks) {
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
      return Balanced(slices, T, num_ranks);
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

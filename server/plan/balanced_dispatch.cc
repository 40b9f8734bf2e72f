#include "server/plan/balanced_dispatch.h"

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <limits>
#include <tuple>
#include <utility>

#include "server/plan/build_plan.h"
#include "server/plan/demand.h"
#include "server/plan/dispatch.h"
#include "server/plan/parallel.h"

namespace hsap::plan::internal {
namespace {

// Quota of rank r: floor(T / P) plus one for the first T % P ranks.
int64_t Quota(int64_t total, int32_t ranks, int32_t r) {
  return total / ranks + (r < total % ranks ? 1 : 0);
}

// A run of query rows [begin, end) whose slices are slices[first, last)
// (a document: one slice; rows no slice covers: none).
struct Unit {
  int64_t begin = 0;
  int64_t end = 0;
  size_t first_slice = 0;
  size_t last_slice = 0;
  int64_t area = 0;
};

int64_t PrefixArea(absl::Span<const MaskSlice> slices, const Unit& u, int64_t x) {
  int64_t a = 0;
  for (size_t i = u.first_slice; i < u.last_slice; ++i) {
    a += SliceArea(ClipRows(slices[i], slices[i].q_begin, x));
  }
  return a;
}

// Groups slices with overlapping query rows into units and fills the rows no
// slice covers with area-0 units.
std::vector<Unit> BuildUnits(absl::Span<const MaskSlice> slices, int64_t total) {
  std::vector<Unit> units;
  int64_t cursor = 0;
  size_t i = 0;
  while (i < slices.size()) {
    Unit u;
    u.begin = slices[i].q_begin;
    u.end = slices[i].q_end;
    u.first_slice = i;
    for (++i; i < slices.size() && slices[i].q_begin < u.end; ++i) {
      u.end = std::max(u.end, slices[i].q_end);
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
  int64_t begin = 0;
  int64_t end = 0;
  int64_t area = 0;
  int64_t unit = 0;
};

// The items of one level, in position order: units of at most `piece`
// tokens whole, longer ones cut into pieces of `piece` tokens (a causal
// document's first pieces are light and its last heavy). With `within`
// (sorted, disjoint), only those tokens: each unit's runs inside them, run
// by run, each whole or cut the same way.
std::vector<Item> MakeItems(absl::Span<const MaskSlice> slices, const std::vector<Unit>& units,
                            int64_t piece, const std::vector<TokenRange>* within = nullptr) {
  std::vector<Item> items;
  if (within != nullptr) {
    for (const TokenRange& w : *within) {
      // The first unit that ends after w.begin (units tile [0, total)).
      size_t ui = static_cast<size_t>(
          std::upper_bound(units.begin(), units.end(), w.begin,
                           [](int64_t x, const Unit& u) { return x < u.end; }) -
          units.begin());
      for (; ui < units.size() && units[ui].begin < w.end; ++ui) {
        const Unit& u = units[ui];
        const int64_t id = static_cast<int64_t>(ui);
        const int64_t b = std::max(u.begin, w.begin), e = std::min(u.end, w.end);
        int64_t ax = PrefixArea(slices, u, b);
        for (int64_t x = b; x < e; x += piece) {
          const int64_t cut = std::min(e, x + piece);
          const int64_t a = PrefixArea(slices, u, cut);
          items.push_back({x, cut, a - ax, id});
          ax = a;
        }
      }
    }
    return items;
  }
  for (size_t ui = 0; ui < units.size(); ++ui) {
    const Unit& u = units[ui];
    const int64_t id = static_cast<int64_t>(ui);
    if (u.end - u.begin <= piece) {
      if (u.end > u.begin) items.push_back({u.begin, u.end, u.area, id});
      continue;
    }
    int64_t ax = 0;
    for (int64_t x = u.begin; x < u.end; x += piece) {
      const int64_t cut = std::min(u.end, x + piece);
      const int64_t a = PrefixArea(slices, u, cut);
      items.push_back({x, cut, a - ax, id});
      ax = a;
    }
  }
  return items;
}

// Placement order: heaviest first (LPT), then longest, ties by position.
std::vector<Item> Lpt(std::vector<Item> items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.area != b.area) return a.area > b.area;
    if (a.end - a.begin != b.end - b.begin) return a.end - a.begin > b.end - b.begin;
    return a.begin < b.begin;
  });
  return items;
}

struct Attempt {
  std::vector<std::vector<TokenRange>> ranges;
  double imbalance = -1;  // < 0: no attempt yet
  int64_t max_need = 0;   // estimated need of the busiest rank, tokens
};

// Ranks ordered by a key, among those with room: a segment tree over ranks
// holding, for each of kKeys orders (area or need, among ranks with any
// room or with room for a full piece), the (key, rank) minimum of each
// subtree, and its largest room. One Update refreshes every order in one
// O(log P) pass; Visit finds the k best ranks of one order with enough
// room in one pruned depth-first search, O(k log P) when keys are spread.
class RankTree {
 public:
  static constexpr int kKeys = 4;
  struct Order {
    const std::vector<int64_t>* keys;
    int64_t min_leaf_room;  // ranks with less room are left out (>= 1)
  };
  RankTree(std::array<Order, kKeys> orders, const std::vector<int64_t>* cap)
      : orders_(orders), cap_(cap) {
    for (Order& o : orders_) o.min_leaf_room = std::max<int64_t>(1, o.min_leaf_room);
    n_ = 1;
    while (n_ < cap->size()) n_ *= 2;
    for (std::vector<Key>& m : min_) m.assign(2 * n_, kNone);
    room_.assign(2 * n_, 0);
    for (size_t r = 0; r < cap->size(); ++r) SetLeaf(r);
    for (size_t i = n_ - 1; i >= 1; --i) Pull(i);
  }
  void Update(int32_t r) {
    size_t i = SetLeaf(r);
    for (i /= 2; i >= 1; i /= 2) Pull(i);
  }
  // Calls f(rank) for ranks with room >= min_room in order `order`'s (key,
  // rank) order until f returns true or `limit` (<= kMaxVisit) ranks were
  // visited.
  static constexpr int kMaxVisit = 2;
  template <typename F>
  void Visit(int order, int limit, int64_t min_room, F&& f) const {
    Key best[kMaxVisit];
    int found = 0;
    Search(1, order, min_room, std::min(limit, kMaxVisit), best, &found);
    for (int k = 0; k < found; ++k) {
      if (f(best[k].second)) return;
    }
  }

 private:
  using Key = std::pair<int64_t, int32_t>;
  static constexpr Key kNone = {INT64_MAX, INT32_MAX};
  // Keeps in best[0, *found) (ascending, at most `limit`) the least leaf
  // keys with room >= min_room; a subtree whose minimum cannot enter the
  // list, or without a leaf with enough room, is skipped.
  void Search(size_t i, int order, int64_t min_room, int limit, Key* best, int* found) const {
    const std::vector<Key>& mins = min_[order];
    if (room_[i] < min_room || mins[i] == kNone) return;
    if (*found == limit && !(mins[i] < best[limit - 1])) return;
    if (i >= n_) {
      int k = *found < limit ? (*found)++ : limit - 1;
      for (; k > 0 && mins[i] < best[k - 1]; --k) best[k] = best[k - 1];
      best[k] = mins[i];
      return;
    }
    size_t a = 2 * i, b = 2 * i + 1;
    if (mins[b] < mins[a]) std::swap(a, b);
    Search(a, order, min_room, limit, best, found);
    Search(b, order, min_room, limit, best, found);
  }
  size_t SetLeaf(size_t r) {
    const size_t i = n_ + r;
    const int64_t room = (*cap_)[r];
    for (int k = 0; k < kKeys; ++k) {
      min_[k][i] = room >= orders_[k].min_leaf_room
                       ? std::make_pair((*orders_[k].keys)[r], static_cast<int32_t>(r))
                       : kNone;
    }
    room_[i] = room;
    return i;
  }
  void Pull(size_t i) {
    for (std::vector<Key>& m : min_) m[i] = std::min(m[2 * i], m[2 * i + 1]);
    room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }
  std::array<Order, kKeys> orders_;
  const std::vector<int64_t>* cap_;
  size_t n_ = 1;
  std::array<std::vector<Key>, kKeys> min_;  // per order, per node
  std::vector<int64_t> room_;                // per node: the largest room below
};

// Places `items` in order (see the header) on bins (ranks, or nodes) of
// `quotas` tokens (their sum is the items' tokens). Every bin ends with
// exactly its quota of tokens: an item no bin has room for fills the bins
// with the most room.
// `stop` (may be null) is polled every 1,024 items: a stopped placement
// returns at once with an infinite imbalance (it never wins).
Attempt Place(absl::Span<const MaskSlice> slices, const std::vector<Unit>& units,
              const std::vector<Item>& items, const std::vector<int64_t>& quotas, double slack,
              const std::function<bool()>* stop) {
  constexpr int kCandidates = 4;
  constexpr int kTreeCandidates = 2;
  const int32_t ranks = static_cast<int32_t>(quotas.size());
  int64_t total = 0;
  for (int64_t q : quotas) total += q;
  std::vector<int64_t> cap = quotas, area(ranks, 0), need(ranks, 0);
  // Ranks with room, and ranks with room for the longest item (the level's
  // piece): searches for an item of that length, most of them, then never
  // walk past ranks too full for it.
  int64_t piece = 1;
  for (const Item& it : items) piece = std::max(piece, it.end - it.begin);
  enum { kByArea, kByNeed, kPieceByArea, kPieceByNeed };
  RankTree tree({RankTree::Order{&area, 1}, RankTree::Order{&need, 1},
                 RankTree::Order{&area, piece}, RankTree::Order{&need, piece}},
                &cap);
  // Per rank: the units it holds with the end of its last run in each (few
  // per rank); per unit: the ranks holding some of it, most recent last.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> rank_units(ranks);
  std::vector<std::vector<int32_t>> holders(units.size());
  auto added_need = [&](int32_t r, int64_t unit, int64_t begin) {
    int64_t from = units[unit].begin;
    for (const auto& [u, end] : rank_units[r]) {
      if (u == unit) from = std::max(from, end);
    }
    return std::max<int64_t>(0, begin - from);
  };
  Attempt out;
  out.ranges.assign(ranks, {});
  auto place = [&](int32_t r, int64_t unit, int64_t b, int64_t e, int64_t a) {
    const int64_t added = added_need(r, unit, b);
    out.ranges[r].push_back({b, e});
    cap[r] -= e - b;
    area[r] += a;
    need[r] += added;
    tree.Update(r);
    auto& ru = rank_units[r];
    auto h = std::find_if(ru.begin(), ru.end(), [&](const auto& p) { return p.first == unit; });
    if (h == ru.end()) {
      ru.push_back({unit, e});
      holders[unit].push_back(r);
    } else {
      h->second = std::max(h->second, e);
    }
  };
  int64_t left_area = 0, left_tokens = total;
  for (const Item& it : items) left_area += it.area;
  const double area_limit = static_cast<double>(left_area) / ranks * (1.0 + slack);
  std::vector<int32_t> candidates;
  int64_t placed = 0;
  for (const Item& it : items) {
    if ((++placed & 1023) == 0 && stop != nullptr && *stop && (*stop)()) {
      out.imbalance = std::numeric_limits<double>::infinity();
      return out;
    }
    const int64_t len = it.end - it.begin;
    left_area -= it.area;
    left_tokens -= len;
    // The rest of a rank's room will fill at about the mean density of what
    // is left to place.
    const double rho = left_tokens > 0 ? static_cast<double>(left_area) / left_tokens : 0.0;
    candidates.clear();
    const auto& hs = holders[it.unit];
    for (size_t i = hs.size() > kCandidates ? hs.size() - kCandidates : 0; i < hs.size(); ++i) {
      candidates.push_back(hs[i]);
    }
    const int with_room_by_area = len == piece ? kPieceByArea : kByArea;
    const int with_room_by_need = len == piece ? kPieceByNeed : kByNeed;
    tree.Visit(with_room_by_area, kTreeCandidates, len, [&](int32_t r) {
      candidates.push_back(r);
      return false;
    });
    tree.Visit(with_room_by_need, kTreeCandidates, len, [&](int32_t r) {
      candidates.push_back(r);
      return false;
    });
    int32_t best = -1;
    std::tuple<int64_t, int64_t, int64_t, int32_t> best_key;
    for (int32_t r : candidates) {
      if (cap[r] < len) continue;
      if (static_cast<double>(area[r] + it.area) + static_cast<double>(cap[r] - len) * rho >
          area_limit) {
        continue;
      }
      // Least added need, then least resulting need, then least area.
      const int64_t added = added_need(r, it.unit, it.begin);
      const auto key = std::make_tuple(added, need[r] + added, area[r], r);
      if (best < 0 || key < best_key) {
        best = r;
        best_key = key;
      }
    }
    if (best < 0) {  // LPT: the least area with room for the item
      tree.Visit(with_room_by_area, 1, len, [&](int32_t r) {
        best = r;
        return true;
      });
    }
    if (best >= 0) {
      place(best, it.unit, it.begin, it.end, it.area);
      continue;
    }
    const Unit& u = units[it.unit];
    for (int64_t x = it.begin; x < it.end;) {
      int32_t r_min = -1;  // least area first
      tree.Visit(kByArea, 1, 1, [&](int32_t r) {
        r_min = r;
        return true;
      });
      const int64_t e = std::min(it.end, x + cap[r_min]);
      place(r_min, it.unit, x, e, PrefixArea(slices, u, e) - PrefixArea(slices, u, x));
      x = e;
    }
  }
  int64_t sum = 0, max = 0;
  for (int32_t r = 0; r < ranks; ++r) {
    sum += area[r];
    max = std::max(max, area[r]);
  }
  out.imbalance = sum > 0 ? static_cast<double>(max) * ranks / static_cast<double>(sum) : 1.0;
  out.max_need = *std::max_element(need.begin(), need.end());
  return out;
}

// The least imbalance asked of one node's ranks: an exactly even split is
// rarely possible, and asking for it tries every piece size (at 64 x 8,
// T = 1M, the heaviest nodes' searches then took most of the compile).
constexpr double kMinNodeRankGoal = 1.01;

// One balanced placement problem: bins of `quotas` tokens (ranks, or nodes)
// over all tokens, or over `within` only (a node's tokens, for its ranks).
struct Bins {
  std::vector<int64_t> quotas;
  const std::vector<TokenRange>* within = nullptr;  // sorted, disjoint; null: [0, total)
  double goal = kBalancedImbalanceGoal;             // imbalance accepted (over these bins)
  // Try one piece size past the first balanced one (it can lower the need;
  // a node's ranks skip it: their need is mostly intra-node).
  bool extra_level = true;
};

// A valid placement when stopped: the tokens in order, quota by quota (the
// caller discards it).
std::vector<std::vector<TokenRange>> InOrder(const Bins& bins, int64_t total) {
  std::vector<TokenRange> tokens =
      bins.within != nullptr ? *bins.within : std::vector<TokenRange>{{0, total}};
  std::vector<std::vector<TokenRange>> out(bins.quotas.size());
  size_t t = 0;
  int64_t x = tokens.empty() ? 0 : tokens[0].begin;
  for (size_t r = 0; r < bins.quotas.size(); ++r) {
    for (int64_t left = bins.quotas[r]; left > 0 && t < tokens.size();) {
      const int64_t e = std::min(tokens[t].end, x + left);
      out[r].push_back({x, e});
      left -= e - x;
      x = e;
      if (x == tokens[t].end && ++t < tokens.size()) x = tokens[t].begin;
    }
  }
  return out;
}

// The levels and attempts of the header over `bins`: the winning attempt
// (ranges normalized), its imbalance over the bins and its busiest bin's
// exact need in tokens (when it reached the goal). Stopped: InOrder.
Attempt Solve(absl::Span<const MaskSlice> slices, const std::vector<Unit>& units,
              const SliceIndex& index, int64_t total, const Bins& bins, ThreadPool* pool,
              const std::function<bool()>* stop) {
  const int32_t ranks = static_cast<int32_t>(bins.quotas.size());
  const int64_t quota =
      std::max<int64_t>(1, *std::max_element(bins.quotas.begin(), bins.quotas.end()));
  const double goal = bins.goal;
  // Polled between the levels below too: one level's items and their sort
  // take about a second under ASan at 2^20 documents.
  auto stopped = [stop] { return stop != nullptr && *stop && (*stop)(); };
  // The exact need of the busiest bin (DESIGN.md §8: of a node, its
  // inter-node need), for the attempts balanced enough to compete on
  // communication.
  auto exact_max_need = [&](std::vector<std::vector<TokenRange>>* ranges) {
    std::vector<int64_t> need(ranks, 0);
    ForEachIndex(pool, ranks, [&](int64_t r) {
      (*ranges)[r] = Normalize(std::move((*ranges)[r]));
      std::vector<OwnerSegment> home;
      int64_t row = 0;
      for (const TokenRange& t : (*ranges)[r]) {
        home.push_back({t.begin, t.end, static_cast<int32_t>(r), row});
        row += t.size();
      }
      need[r] = TotalTokens(ExactNeed(ComputeDemands(index, home), home));
    });
    return *std::max_element(need.begin(), need.end());
  };
  Attempt best;
  auto consider = [&](Attempt a) {
    if (a.imbalance <= goal) a.max_need = exact_max_need(&a.ranges);
    const bool a_good = a.imbalance <= goal;
    const bool best_good = best.imbalance >= 0 && best.imbalance <= goal;
    if (best.imbalance < 0 || (a_good && (!best_good || a.max_need < best.max_need)) ||
        (!a_good && !best_good && a.imbalance < best.imbalance)) {
      best = std::move(a);
    }
  };
  auto items_of = [&](int64_t piece) { return MakeItems(slices, units, piece, bins.within); };
  // The attempts of one item list with each slack, over the pool.
  auto place_all = [&](const std::vector<Item>& items, absl::Span<const double> slacks) {
    std::vector<Attempt> out(slacks.size());
    ForEachIndex(pool, static_cast<int64_t>(slacks.size()), [&](int64_t i) {
      out[i] = Place(slices, units, items, bins.quotas, slacks[i], stop);
    });
    for (Attempt& a : out) consider(std::move(a));
  };
  constexpr double kSlacks[] = {0.0, 0.04};
  constexpr size_t kExtraLevelMaxItems = 8192;
  // Equal-token pieces of a quota, 1/2, ..., 1/32 of it (coarse to fine);
  // one level past the first balanced one is enough: finer pieces only
  // scatter documents further. That extra level is skipped when it has more
  // than kExtraLevelMaxItems items: its two placements would then cost more
  // than the rest of the dispatch, and on the python-stdlib packs it never
  // won there (it wins 3-10% of the 64K packs, all below 4,096 items).
  // A level whose heaviest item alone exceeds the goal (imbalance >= max
  // item area * P / total area) cannot be balanced: it is placed only if no
  // level turns out balanced, when the most balanced attempt wins.
  int64_t total_area = 0;
  if (bins.within == nullptr) {
    for (const Unit& u : units) total_area += u.area;
  } else {
    for (const Item& it : items_of(quota)) total_area += it.area;
  }
  auto cannot_balance = [&](const std::vector<Item>& items) {
    int64_t heaviest = 0;
    for (const Item& it : items) heaviest = std::max(heaviest, it.area);
    return static_cast<double>(heaviest) * ranks > goal * static_cast<double>(total_area);
  };
  std::vector<int64_t> skipped;
  int levels_after_good = -1;
  const int extra_levels = bins.extra_level ? 1 : 0;
  for (int level = 0; level <= 5 && levels_after_good < extra_levels; ++level) {
    const int64_t piece = quota >> level;
    if ((level > 0 && piece < 16) || stopped()) break;
    std::vector<Item> items = items_of(piece);
    if (levels_after_good == 0 && items.size() > kExtraLevelMaxItems) break;
    if (stopped()) break;
    if (cannot_balance(items)) {
      skipped.push_back(piece);
      continue;
    }
    place_all(Lpt(std::move(items)), kSlacks);
    if (levels_after_good >= 0 || best.imbalance <= goal) ++levels_after_good;
  }
  if (best.imbalance < 0 || best.imbalance > goal) {
    for (int64_t piece : skipped) {
      if (stopped()) break;
      place_all(Lpt(items_of(piece)), kSlacks);
    }
  }
  // Nothing balanced yet: finer pieces, down to 16 tokens.
  for (int64_t piece = quota >> 6; best.imbalance > goal && piece >= 16 && !stopped();
       piece /= 2) {
    consider(Place(slices, units, Lpt(items_of(piece)), bins.quotas, 0.04, stop));
  }
  if (stopped()) {
    Attempt in_order;
    in_order.ranges = InOrder(bins, total);
    return in_order;
  }
  for (auto& r : best.ranges) r = Normalize(std::move(r));
  return best;
}

// Area of each bin's ranges over the mask's units.
std::vector<int64_t> AreasOf(absl::Span<const MaskSlice> slices, const std::vector<Unit>& units,
                             int64_t total, const std::vector<std::vector<TokenRange>>& ranges) {
  std::vector<int64_t> out(ranges.size(), 0);
  for (size_t r = 0; r < ranges.size(); ++r) {
    for (const Item& it : MakeItems(slices, units, std::max<int64_t>(1, total), &ranges[r])) {
      out[r] += it.area;
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<TokenRange>> BalancedRanges(absl::Span<const MaskSlice> slices,
                                                    int64_t total, int32_t ranks,
                                                    int32_t ranks_per_node, ThreadPool* pool) {
  if (total == 0) return std::vector<std::vector<TokenRange>>(ranks);
  const std::vector<Unit> units = BuildUnits(slices, total);
  const SliceIndex index(slices);
  // The compile's stop callback, taken on this thread: the placements run
  // on the pool's threads.
  const std::function<bool()>* const stop = CurrentCompileStop();
  Bins rank_bins;
  for (int32_t r = 0; r < ranks; ++r) rank_bins.quotas.push_back(Quota(total, ranks, r));
  if (ranks_per_node <= 0 || ranks_per_node >= ranks || ranks % ranks_per_node != 0) {
    return Solve(slices, units, index, total, rank_bins, pool, stop).ranges;
  }
  // Nodes first (docs/planner.md, "Assignment policies"): each node's quota
  // is its ranks' quotas; a node's exact need is what must cross the
  // inter-node links to it.
  const int32_t rpn = ranks_per_node;
  const int32_t nodes = ranks / rpn;
  Bins node_bins;
  node_bins.quotas.assign(nodes, 0);
  for (int32_t r = 0; r < ranks; ++r) node_bins.quotas[r / rpn] += rank_bins.quotas[r];
  node_bins.goal = kNodeImbalanceGoal;
  const Attempt by_node = Solve(slices, units, index, total, node_bins, pool, stop);
  if (stop != nullptr && *stop && (*stop)()) return InOrder(rank_bins, total);
  // Then each node's tokens on its ranks, to the rank goal over the whole
  // group: a node f times as loaded as the mean node has its ranks balanced
  // to goal / f (as evenly as it can when f exceeds the goal).
  const std::vector<int64_t> node_area = AreasOf(slices, units, total, by_node.ranges);
  int64_t area_sum = 0;
  for (int64_t a : node_area) area_sum += a;
  std::vector<std::vector<TokenRange>> out(ranks);
  ForEachIndex(pool, nodes, [&](int64_t n) {
    Bins b;
    b.quotas.assign(rank_bins.quotas.begin() + n * rpn, rank_bins.quotas.begin() + (n + 1) * rpn);
    b.within = &by_node.ranges[n];
    b.extra_level = false;
    const double f = area_sum > 0 ? static_cast<double>(node_area[n]) * nodes /
                                        static_cast<double>(area_sum)
                                  : 1.0;
    b.goal = std::max(kMinNodeRankGoal, kBalancedImbalanceGoal / std::max(f, 1e-9));
    Attempt a = Solve(slices, units, index, total, b, nullptr, stop);
    for (int32_t i = 0; i < rpn; ++i) out[n * rpn + i] = std::move(a.ranges[i]);
  });
  return out;
}

}  // namespace hsap::plan::internal

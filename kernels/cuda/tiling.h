// Tile arithmetic of the CUDA attention kernels, shared by host and device.
//
// A work item is one mask slice (common/mask.h) of num_q query rows against
// num_k keys. The kernels cut it into tiles: the forward kernel into blocks
// of query rows (each walking the key blocks its rows can see), the backward
// kernel into blocks of keys (each walking the query blocks that see them).
// The functions here decide which blocks a tile visits and which of those
// need the per-element mask; they rest on RowKeyRange (the one definition of
// the mask rule) and on its bounds lo(r), hi(r) being non-decreasing in r.
// kernels/cuda/tiling_test.cc checks them against brute force on the CPU,
// so the GPU kernels run arithmetic that CI covers.
//
// The host-only part at the bottom builds the flattened tile tables a launch
// walks and splits forward items into waves whose accumulators are disjoint.
#ifndef HSAP_KERNELS_CUDA_TILING_H_
#define HSAP_KERNELS_CUDA_TILING_H_

#include <cstdint>

#include "common/dtype.h"  // HSAP_HOST_DEVICE
#include "common/mask.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

namespace hsap::kernels::cuda {

// The geometry of one work item, without its pointers.
struct SliceGeometry {
  int64_t num_q = 0;
  int64_t num_k = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;
  int64_t window = -1;
};

// Keys (relative to the item) that some row of [row_begin, row_end) may see,
// as [*key_begin, *key_end): a superset of the union of the rows' ranges,
// empty (*key_begin >= *key_end) when no row sees a key. Rows at or past
// num_q are ignored (the padding rows of a last, partial block).
HSAP_HOST_DEVICE inline void QBlockKeyRange(const SliceGeometry& g, int64_t row_begin,
                                            int64_t row_end, int64_t* key_begin,
                                            int64_t* key_end) {
  if (row_end > g.num_q) row_end = g.num_q;
  *key_begin = 0;
  *key_end = 0;
  if (row_begin >= row_end) return;
  int64_t lo_first, hi_first, lo_last, hi_last;
  RowKeyRange(g.type, g.offset, g.window, g.num_k, row_begin, &lo_first, &hi_first);
  RowKeyRange(g.type, g.offset, g.window, g.num_k, row_end - 1, &lo_last, &hi_last);
  // lo and hi are non-decreasing in the row: the union lies in [lo(first), hi(last)).
  *key_begin = lo_first;
  *key_end = hi_last > lo_first ? hi_last : lo_first;
}

// Whether every (row, key) of [row_begin, row_end) x [key_begin, key_end) is
// inside the item and allowed, so the kernel may skip the per-element mask.
HSAP_HOST_DEVICE inline bool BlockIsInterior(const SliceGeometry& g, int64_t row_begin,
                                             int64_t row_end, int64_t key_begin,
                                             int64_t key_end) {
  if (row_begin >= row_end || key_begin >= key_end) return true;  // nothing to mask
  if (row_end > g.num_q || key_end > g.num_k || row_begin < 0 || key_begin < 0) return false;
  if (g.type == MaskType::kFull) return true;
  int64_t lo_first, hi_first, lo_last, hi_last;
  RowKeyRange(g.type, g.offset, g.window, g.num_k, row_begin, &lo_first, &hi_first);
  RowKeyRange(g.type, g.offset, g.window, g.num_k, row_end - 1, &lo_last, &hi_last);
  // Largest lo is lo(last row), smallest hi is hi(first row).
  return lo_last <= key_begin && key_end <= hi_first;
}

// Query rows that may see some key of [key_begin, key_end), as
// [*row_begin, *row_end): a superset of those rows (binary search over the
// monotone bounds: rows with hi(r) > key_begin and lo(r) < key_end).
HSAP_HOST_DEVICE inline void KBlockRowRange(const SliceGeometry& g, int64_t key_begin,
                                            int64_t key_end, int64_t* row_begin,
                                            int64_t* row_end) {
  *row_begin = 0;
  *row_end = 0;
  if (g.num_q <= 0 || key_begin >= key_end) return;
  if (g.type == MaskType::kFull) {
    *row_end = g.num_q;
    return;
  }
  int64_t lo, hi;
  // First row with hi(r) > key_begin.
  int64_t a = 0, b = g.num_q;
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    RowKeyRange(g.type, g.offset, g.window, g.num_k, mid, &lo, &hi);
    if (hi > key_begin) b = mid; else a = mid + 1;
  }
  const int64_t first = a;
  // First row with lo(r) >= key_end.
  a = first;
  b = g.num_q;
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    RowKeyRange(g.type, g.offset, g.window, g.num_k, mid, &lo, &hi);
    if (lo >= key_end) b = mid; else a = mid + 1;
  }
  *row_begin = first;
  *row_end = a;
}

// Number of blocks of `block` covering n (0 for n <= 0).
HSAP_HOST_DEVICE constexpr int64_t CeilBlocks(int64_t n, int64_t block) {
  return n <= 0 ? 0 : (n + block - 1) / block;
}

// One tile of a launch: block `block` (of query rows for the forward kernel,
// of keys for the backward kernel) of item `item`.
struct TileRef {
  int32_t item = 0;
  int32_t block = 0;
};

// Host-only from here.

// The forward tiles of `items` (blocks of `block_q` query rows that see at
// least one key), largest key range first so long tiles start early. Tiles
// whose rows see no key are left out: their accumulators stay as they are,
// which is the merge of an empty partial.
inline std::vector<TileRef> BuildForwardTiles(const std::vector<SliceGeometry>& items,
                                              const std::vector<int32_t>& item_ids,
                                              int64_t block_q) {
  std::vector<std::pair<int64_t, TileRef>> tiles;
  for (int32_t id : item_ids) {
    const SliceGeometry& g = items[id];
    for (int64_t b = 0; b < CeilBlocks(g.num_q, block_q); ++b) {
      int64_t kb, ke;
      QBlockKeyRange(g, b * block_q, (b + 1) * block_q, &kb, &ke);
      if (kb < ke) tiles.push_back({ke - kb, TileRef{id, static_cast<int32_t>(b)}});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<TileRef> out;
  out.reserve(tiles.size());
  for (const auto& t : tiles) out.push_back(t.second);
  return out;
}

// The backward tiles of `items` (blocks of `block_k` keys seen by at least
// one row), longest row range first.
inline std::vector<TileRef> BuildBackwardTiles(const std::vector<SliceGeometry>& items,
                                               int64_t block_k) {
  std::vector<std::pair<int64_t, TileRef>> tiles;
  for (int32_t id = 0; id < static_cast<int32_t>(items.size()); ++id) {
    const SliceGeometry& g = items[id];
    for (int64_t b = 0; b < CeilBlocks(g.num_k, block_k); ++b) {
      int64_t rb, re;
      KBlockRowRange(g, b * block_k, std::min((b + 1) * block_k, g.num_k), &rb, &re);
      if (rb < re) tiles.push_back({re - rb, TileRef{id, static_cast<int32_t>(b)}});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<TileRef> out;
  out.reserve(tiles.size());
  for (const auto& t : tiles) out.push_back(t.second);
  return out;
}

// Address ranges [begin, end) an item's forward merge writes.
struct AccumulatorSpan {
  uintptr_t o_begin = 0, o_end = 0;      // its o_acc rows
  uintptr_t lse_begin = 0, lse_end = 0;  // its head-0 LSE columns
};

// Splits items into waves (returns each item's wave, 0-based): each item
// goes to the wave right after the last wave holding an earlier item whose
// spans overlap its own (wave 0 if none). So items in one wave never share
// accumulator memory, and conflicting items run in the order given.
inline std::vector<int> AssignWaves(const std::vector<AccumulatorSpan>& spans) {
  std::vector<std::map<uintptr_t, uintptr_t>> waves;  // per wave: begin -> end, disjoint
  auto overlaps = [](const std::map<uintptr_t, uintptr_t>& m, uintptr_t b, uintptr_t e) {
    if (b >= e) return false;
    auto it = m.lower_bound(b);
    if (it != m.end() && it->first < e) return true;
    if (it != m.begin() && std::prev(it)->second > b) return true;
    return false;
  };
  std::vector<int> out(spans.size(), 0);
  for (size_t i = 0; i < spans.size(); ++i) {
    const AccumulatorSpan& s = spans[i];
    // After the last wave holding a conflicting item.
    int w = 0;
    for (int x = static_cast<int>(waves.size()) - 1; x >= 0; --x) {
      if (overlaps(waves[x], s.o_begin, s.o_end) || overlaps(waves[x], s.lse_begin, s.lse_end)) {
        w = x + 1;
        break;
      }
    }
    if (w == static_cast<int>(waves.size())) waves.emplace_back();
    if (s.o_begin < s.o_end) waves[w][s.o_begin] = s.o_end;
    if (s.lse_begin < s.lse_end) waves[w][s.lse_begin] = s.lse_end;
    out[i] = w;
  }
  return out;
}

}  // namespace hsap::kernels::cuda

#endif  // HSAP_KERNELS_CUDA_TILING_H_

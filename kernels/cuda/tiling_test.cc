// The CUDA kernels' tile arithmetic (tiling.h) against brute force over
// random mask slices, on the CPU. Besides each function's own contract, two
// emulations replay the kernels' loops exactly (which blocks a tile visits,
// which need the mask, which elements the mask keeps) and check that every
// allowed (q, k) pair of every item is computed exactly once and no other.
#include "kernels/cuda/tiling.h"

#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace hsap::kernels::cuda {
namespace {

bool Allowed(const SliceGeometry& g, int64_t r, int64_t c) {
  return r >= 0 && r < g.num_q && c >= 0 && c < g.num_k &&
         SliceAllows(g.type, g.offset, g.window, r, c);
}

std::string Describe(const SliceGeometry& g) {
  return "nq=" + std::to_string(g.num_q) + " nk=" + std::to_string(g.num_k) +
         (g.type == MaskType::kFull ? " FULL" : " CAUSAL") + " offset=" +
         std::to_string(g.offset) + " window=" + std::to_string(g.window);
}

SliceGeometry DrawGeometry(std::mt19937_64* rng) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(*rng);
  };
  SliceGeometry g;
  g.num_q = uniform(0, 4) == 0 ? uniform(0, 3) : uniform(1, 300);
  g.num_k = uniform(0, 4) == 0 ? uniform(0, 3) : uniform(1, 300);
  g.type = uniform(0, 4) == 0 ? MaskType::kFull : MaskType::kCausal;
  if (g.type == MaskType::kCausal) {
    switch (uniform(0, 3)) {
      case 0: g.offset = 0; break;
      case 1: g.offset = g.num_k - g.num_q; break;  // bottom-right
      default: g.offset = uniform(-g.num_q - 5, g.num_k + 5); break;
    }
    g.window = uniform(0, 2) == 0 ? uniform(0, 120) : -1;
  }
  return g;
}

constexpr int kCases = 3000;

TEST(TilingTest, QBlockKeyRangeCoversEveryAllowedKey) {
  std::mt19937_64 rng(1);
  for (int n = 0; n < kCases; ++n) {
    const SliceGeometry g = DrawGeometry(&rng);
    for (int64_t block : {16, 64, 128}) {
      for (int64_t r0 = 0; r0 < g.num_q; r0 += block) {
        int64_t kb, ke;
        QBlockKeyRange(g, r0, r0 + block, &kb, &ke);
        bool any = false;
        for (int64_t r = r0; r < std::min(r0 + block, g.num_q); ++r) {
          for (int64_t c = 0; c < g.num_k; ++c) {
            if (!Allowed(g, r, c)) continue;
            any = true;
            ASSERT_TRUE(kb <= c && c < ke) << Describe(g) << " rows " << r0 << "+" << block
                                           << " key " << c << " outside [" << kb << "," << ke
                                           << ")";
          }
        }
        if (any) {
          ASSERT_GE(kb, 0) << Describe(g);
          ASSERT_LE(ke, g.num_k) << Describe(g);
        }
      }
    }
  }
}

TEST(TilingTest, BlockIsInteriorIsExact) {
  std::mt19937_64 rng(2);
  int interior = 0, edge = 0;
  for (int n = 0; n < kCases; ++n) {
    const SliceGeometry g = DrawGeometry(&rng);
    std::uniform_int_distribution<int64_t> row(-2, g.num_q + 2), key(-2, g.num_k + 2);
    for (int b = 0; b < 20; ++b) {
      const int64_t rb = row(rng), kb = key(rng);
      const int64_t re = rb + std::uniform_int_distribution<int64_t>(1, 70)(rng);
      const int64_t ke = kb + std::uniform_int_distribution<int64_t>(1, 70)(rng);
      bool all = true;
      for (int64_t r = rb; r < re && all; ++r) {
        for (int64_t c = kb; c < ke && all; ++c) all = Allowed(g, r, c);
      }
      ASSERT_EQ(BlockIsInterior(g, rb, re, kb, ke), all)
          << Describe(g) << " rows [" << rb << "," << re << ") keys [" << kb << "," << ke << ")";
      (all ? interior : edge)++;
    }
  }
  // Both answers occur often enough for the equality to mean something.
  EXPECT_GT(interior, 1000);
  EXPECT_GT(edge, 1000);
}

TEST(TilingTest, KBlockRowRangeCoversEveryRowThatSeesTheBlock) {
  std::mt19937_64 rng(3);
  for (int n = 0; n < kCases; ++n) {
    const SliceGeometry g = DrawGeometry(&rng);
    for (int64_t k0 = 0; k0 < g.num_k; k0 += 64) {
      const int64_t k1 = std::min(k0 + 64, g.num_k);
      int64_t rb, re;
      KBlockRowRange(g, k0, k1, &rb, &re);
      ASSERT_GE(rb, 0);
      ASSERT_LE(re, g.num_q);
      for (int64_t r = 0; r < g.num_q; ++r) {
        for (int64_t c = k0; c < k1; ++c) {
          if (Allowed(g, r, c)) {
            ASSERT_TRUE(rb <= r && r < re) << Describe(g) << " keys " << k0 << " row " << r;
          }
        }
      }
    }
  }
}

// Replays the forward kernel's loops (attention_fwd.cu) over the tiles
// BuildForwardTiles makes; counts how often each (r, c) enters the softmax.
std::vector<int> EmulateForward(const SliceGeometry& g, int64_t block_q, int64_t block_k) {
  std::vector<int> count(g.num_q * g.num_k, 0);
  for (const TileRef& tile : BuildForwardTiles({g}, {0}, block_q)) {
    const int64_t row0 = tile.block * block_q;
    int64_t key_begin, key_end;
    QBlockKeyRange(g, row0, row0 + block_q, &key_begin, &key_end);
    EXPECT_LT(key_begin, key_end);
    const int64_t rows_valid_end = std::min(row0 + block_q, g.num_q);
    for (int64_t n = 0; n < CeilBlocks(key_end - key_begin, block_k); ++n) {
      const int64_t kb = key_begin + n * block_k;
      const bool interior = BlockIsInterior(g, row0, rows_valid_end, kb, kb + block_k);
      for (int64_t r = row0; r < rows_valid_end; ++r) {
        int64_t lo, hi;
        RowKeyRange(g.type, g.offset, g.window, g.num_k, r, &lo, &hi);
        for (int64_t c = kb; c < kb + block_k; ++c) {
          if (interior || (c >= lo && c < hi)) {
            // The kernel zero-fills keys past num_k; an unmasked one would be a bug.
            EXPECT_LT(c, g.num_k) << Describe(g);
            if (c < g.num_k) ++count[r * g.num_k + c];
          }
        }
      }
    }
  }
  return count;
}

// Replays the backward kernel's loops (attention_bwd.cu).
std::vector<int> EmulateBackward(const SliceGeometry& g, int64_t block_q, int64_t block_k) {
  std::vector<int> count(g.num_q * g.num_k, 0);
  for (const TileRef& tile : BuildBackwardTiles({g}, block_k)) {
    const int64_t key0 = tile.block * block_k;
    int64_t row_begin, row_end;
    KBlockRowRange(g, key0, std::min(key0 + block_k, g.num_k), &row_begin, &row_end);
    EXPECT_LT(row_begin, row_end);
    for (int64_t rb = row_begin; rb < row_end; rb += block_q) {
      const bool interior = BlockIsInterior(g, rb, rb + block_q, key0, key0 + block_k);
      for (int64_t r = rb; r < rb + block_q; ++r) {
        for (int64_t c = key0; c < key0 + block_k; ++c) {
          const bool kept = interior || (r < g.num_q && c < g.num_k &&
                                         SliceAllows(g.type, g.offset, g.window, r, c));
          if (!kept) continue;
          EXPECT_TRUE(r < g.num_q && c < g.num_k) << Describe(g);
          if (r < g.num_q && c < g.num_k) ++count[r * g.num_k + c];
        }
      }
    }
  }
  return count;
}

TEST(TilingTest, KernelLoopsComputeEveryAllowedPairExactlyOnce) {
  std::mt19937_64 rng(4);
  int64_t pairs = 0;
  for (int n = 0; n < kCases; ++n) {
    const SliceGeometry g = DrawGeometry(&rng);
    // The forward's tiles: 128 x 64 for D <= 128, 64 x 32 for D = 256.
    const bool large = n % 2 == 0;
    const std::vector<int> fwd = EmulateForward(g, large ? 128 : 64, large ? 64 : 32);
    const std::vector<int> bwd = EmulateBackward(g, 64, 64);
    for (int64_t r = 0; r < g.num_q; ++r) {
      for (int64_t c = 0; c < g.num_k; ++c) {
        const int want = Allowed(g, r, c) ? 1 : 0;
        pairs += want;
        ASSERT_EQ(fwd[r * g.num_k + c], want) << "forward " << Describe(g) << " (" << r << ","
                                              << c << ")";
        ASSERT_EQ(bwd[r * g.num_k + c], want) << "backward " << Describe(g) << " (" << r << ","
                                              << c << ")";
      }
    }
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(pairs, 1000000);
}

TEST(TilingTest, TilesAreUniqueInRangeAndLargestFirst) {
  std::mt19937_64 rng(5);
  for (int n = 0; n < 300; ++n) {
    std::vector<SliceGeometry> items;
    for (int i = 0; i < 5; ++i) items.push_back(DrawGeometry(&rng));
    const std::vector<TileRef> fwd = BuildForwardTiles(items, {0, 2, 4}, 64);
    std::set<std::pair<int, int>> seen;
    int64_t previous = INT64_MAX;
    for (const TileRef& t : fwd) {
      ASSERT_TRUE(t.item == 0 || t.item == 2 || t.item == 4);
      ASSERT_LT(t.block, CeilBlocks(items[t.item].num_q, 64));
      ASSERT_TRUE(seen.insert({t.item, t.block}).second);
      int64_t kb, ke;
      QBlockKeyRange(items[t.item], t.block * 64, t.block * 64 + 64, &kb, &ke);
      ASSERT_LE(ke - kb, previous);
      previous = ke - kb;
    }
    const std::vector<TileRef> bwd = BuildBackwardTiles(items, 64);
    seen.clear();
    for (const TileRef& t : bwd) {
      ASSERT_LT(t.block, CeilBlocks(items[t.item].num_k, 64));
      ASSERT_TRUE(seen.insert({t.item, t.block}).second);
    }
  }
}

TEST(TilingTest, WavesSeparateOverlappingAccumulatorsInOrder) {
  std::mt19937_64 rng(6);
  for (int n = 0; n < 500; ++n) {
    std::vector<AccumulatorSpan> spans;
    const int count = std::uniform_int_distribution<int>(0, 40)(rng);
    std::uniform_int_distribution<uintptr_t> at(0, 400), len(0, 60);
    for (int i = 0; i < count; ++i) {
      AccumulatorSpan s;
      s.o_begin = 1000 + at(rng);
      s.o_end = s.o_begin + len(rng);
      s.lse_begin = 5000 + at(rng);
      s.lse_end = s.lse_begin + len(rng) / 4;
      spans.push_back(s);
    }
    const std::vector<int> wave = AssignWaves(spans);
    ASSERT_EQ(wave.size(), spans.size());
    auto overlap = [](uintptr_t b0, uintptr_t e0, uintptr_t b1, uintptr_t e1) {
      return b0 < e0 && b1 < e1 && b0 < e1 && b1 < e0;
    };
    for (int i = 0; i < count; ++i) {
      for (int j = i + 1; j < count; ++j) {
        if (overlap(spans[i].o_begin, spans[i].o_end, spans[j].o_begin, spans[j].o_end) ||
            overlap(spans[i].lse_begin, spans[i].lse_end, spans[j].lse_begin, spans[j].lse_end)) {
          ASSERT_LT(wave[i], wave[j]) << "items " << i << " and " << j;
        }
      }
    }
  }
  // Disjoint items share one wave.
  std::vector<AccumulatorSpan> disjoint;
  for (uintptr_t i = 0; i < 10; ++i) disjoint.push_back({i * 100, i * 100 + 100, 0, 0});
  for (int w : AssignWaves(disjoint)) EXPECT_EQ(w, 0);
}

}  // namespace
}  // namespace hsap::kernels::cuda

#include "kernels/cpu/scratch.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace hsap::kernels::cpu::internal {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(Scratch, IsAlignedAndWritable) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, 3 * kMiB / sizeof(float)}) {
    ScratchPtr p = Scratch(n);
    ASSERT_NE(p.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << n;
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i);
    if (n > 0) EXPECT_EQ(p[n - 1], static_cast<float>(n - 1));
  }
}

TEST(Scratch, ALargeBlockIsReusedByTheNextCallThatFits) {
  if (!kScratchCacheEnabled) GTEST_SKIP() << "sanitized build: nothing is cached";
  const size_t n = 8 * kMiB / sizeof(float);
  float* first;
  {
    ScratchPtr p = Scratch(n);
    first = p.get();
  }
  EXPECT_GE(CachedScratchBytes(), 8 * kMiB);
  {
    ScratchPtr q = Scratch(n - 1000);  // fits: the same block
    EXPECT_EQ(q.get(), first);
    ScratchPtr r = Scratch(n);  // the block is taken: a new one
    EXPECT_NE(r.get(), first);
  }
  {
    // Less than half the block: not handed out (it would hold memory the
    // call does not use).
    ScratchPtr small = Scratch(2 * kMiB / sizeof(float));
    EXPECT_NE(small.get(), first);
  }
}

TEST(Scratch, SmallBlocksAreNotCached) {
  const size_t before = CachedScratchBytes();
  { ScratchPtr p = Scratch(kMinCachedScratchBytes / sizeof(float) - 1); }
  EXPECT_EQ(CachedScratchBytes(), before);
}

TEST(Scratch, TheCacheHoldsAtMostItsLimit) {
  if (!kScratchCacheEnabled) GTEST_SKIP() << "sanitized build: nothing is cached";
  const size_t block = kDefaultScratchCacheBytes / 4;
  const size_t n = block / sizeof(float);
  {
    ScratchPtr a = Scratch(n), b = Scratch(n), c = Scratch(n),
               d = Scratch(n), e = Scratch(n);
  }
  EXPECT_LE(CachedScratchBytes(), kDefaultScratchCacheBytes);
  EXPECT_GE(CachedScratchBytes(), kDefaultScratchCacheBytes - block);
}

TEST(Scratch, ALowerLimitFreesTheOldestBlocksAtOnce) {
  if (!kScratchCacheEnabled) GTEST_SKIP() << "sanitized build: nothing is cached";
  const size_t n = 4 * kMiB / sizeof(float);
  float* newest;
  {
    ScratchPtr a = Scratch(n), b = Scratch(n), c = Scratch(n);
    newest = c.get();
    a.reset();
    b.reset();
  }  // c goes back last
  ASSERT_GE(CachedScratchBytes(), 12 * kMiB);
  SetScratchCacheLimit(6 * kMiB);
  EXPECT_EQ(ScratchCacheLimit(), 6 * kMiB);
  EXPECT_LE(CachedScratchBytes(), 6 * kMiB);
  EXPECT_GE(CachedScratchBytes(), 4 * kMiB);
  {
    ScratchPtr again = Scratch(n);  // the newest block stayed
    EXPECT_EQ(again.get(), newest);
  }
  // A block larger than the limit is freed, not cached: the cache keeps
  // what it held.
  const size_t held = CachedScratchBytes();
  { ScratchPtr big = Scratch(8 * kMiB / sizeof(float)); }
  EXPECT_EQ(CachedScratchBytes(), held);
  {
    ScratchPtr again = Scratch(n);
    EXPECT_EQ(again.get(), newest);
  }
  // Limit 0: a block is freed at the end of its call.
  SetScratchCacheLimit(0);
  EXPECT_EQ(CachedScratchBytes(), 0u);
  { ScratchPtr p = Scratch(n); }
  EXPECT_EQ(CachedScratchBytes(), 0u);
  SetScratchCacheLimit(kDefaultScratchCacheBytes);
}

}  // namespace
}  // namespace hsap::kernels::cpu::internal

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
    ScratchPtr p = Scratch(n, /*keep=*/true);
    first = p.get();
  }
  EXPECT_GE(CachedScratchBytes(), 8 * kMiB);
  {
    ScratchPtr q = Scratch(n - 1000, true);  // fits: the same block
    EXPECT_EQ(q.get(), first);
    ScratchPtr r = Scratch(n, true);  // the block is taken: a new one
    EXPECT_NE(r.get(), first);
  }
  {
    // Less than half the block: not handed out (it would hold memory the
    // call does not use).
    ScratchPtr small = Scratch(2 * kMiB / sizeof(float), true);
    EXPECT_NE(small.get(), first);
  }
}

TEST(Scratch, OnlyKeptBlocksAreCached) {
  const size_t before = CachedScratchBytes();
  { ScratchPtr p = Scratch(16 * kMiB / sizeof(float)); }
  EXPECT_EQ(CachedScratchBytes(), before);
}

TEST(Scratch, TheCacheHoldsAtMostItsBound) {
  if (!kScratchCacheEnabled) GTEST_SKIP() << "sanitized build: nothing is cached";
  const size_t block = kCachedScratchBytes / 4;
  const size_t n = block / sizeof(float);
  {
    ScratchPtr a = Scratch(n, true), b = Scratch(n, true), c = Scratch(n, true),
               d = Scratch(n, true), e = Scratch(n, true);
  }
  EXPECT_LE(CachedScratchBytes(), kCachedScratchBytes);
  EXPECT_GE(CachedScratchBytes(), kCachedScratchBytes - block);
}

}  // namespace
}  // namespace hsap::kernels::cpu::internal

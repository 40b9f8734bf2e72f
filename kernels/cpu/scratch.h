// Internal to kernels/cpu: the scratch buffers of one kernel call.
//
// A call's scratch is left uninitialized: the tiles overwrite every element
// they hand on (a tile that sees nothing writes nothing and is not merged).
// Sanitized builds fill it with NaN, so that a read of an element no tile
// wrote shows in the results (the ASan stage runs the kernel and numerics
// suites).
//
// Blocks of kMinCachedScratchBytes (1 MiB) or more go back to a cache when
// their call ends, up to ScratchCacheLimit() bytes of free blocks in all
// (SetScratchCacheLimit in attention.h; hsapd's --kernel_scratch_cache_bytes),
// and are handed to the next call that fits. A fresh block comes from mmap,
// or from a heap glibc trims again when it is freed, and faults its pages in
// one by one as the tiles first touch them: on the 2-core test VM that cost
// a bf16 VarlenForward at T = 16K a tenth to a fifth of its time and
// command one's small daemon calls 13-36 % (docs/results/kernel_bench.md,
// docs/results/demo.md). PyTorch's caching allocator keeps memory for the
// same reason. The limit bounds what a daemon holds between calls: with 512
// MiB, hsapd grew by 10-14 % over tests/integration/load_test.cc (its
// bound: 10 %), which is why the daemon's default is smaller.
//
//   ScratchPtr p = Scratch(n);  // n floats, 64-byte aligned; cached or freed
#ifndef HSAP_KERNELS_CPU_SCRATCH_H_
#define HSAP_KERNELS_CPU_SCRATCH_H_

#include <cstddef>
#include <memory>

namespace hsap::kernels::cpu::internal {

// Sanitized builds cache nothing: a block freed and handed out again would
// hide a use after its call from ASan.
#if defined(ADDRESS_SANITIZER) || defined(THREAD_SANITIZER)
inline constexpr bool kScratchCacheEnabled = false;
#else
inline constexpr bool kScratchCacheEnabled = true;
#endif
// The cache's limit until SetScratchCacheLimit is called: the three fp32
// accumulators of a bf16 VarlenBackward at T = 16K, D = 256 are 128 MiB each.
inline constexpr size_t kDefaultScratchCacheBytes = size_t{512} << 20;
// Smaller blocks are not cached (malloc serves them from its heap).
inline constexpr size_t kMinCachedScratchBytes = size_t{1} << 20;

struct ScratchDeleter {
  size_t capacity = 0;  // floats
  void operator()(float* p) const;
};
using ScratchPtr = std::unique_ptr<float[], ScratchDeleter>;

// n floats (at least one), uninitialized (NaN under a sanitizer); blocks of
// kMinCachedScratchBytes or more from and back to the cache.
ScratchPtr Scratch(size_t n);

// Bytes of free blocks the cache holds now, and its limit.
size_t CachedScratchBytes();
size_t ScratchCacheLimit();
// Frees the oldest blocks beyond the new limit at once.
void SetScratchCacheLimit(size_t bytes);

}  // namespace hsap::kernels::cpu::internal

#endif  // HSAP_KERNELS_CPU_SCRATCH_H_

// Internal to kernels/cpu: the scratch buffers of one kernel call.
//
// A call's scratch is left uninitialized: the tiles overwrite every element
// they hand on (a tile that sees nothing writes nothing and is not merged).
// Sanitized builds fill it with NaN, so that a read of an element no tile
// wrote shows in the results (the ASan stage runs the kernel and numerics
// suites).
//
// Blocks of 1 MiB and more are kept when a call ends, up to
// kCachedScratchBytes (512 MiB) in all, and handed to the next call that fits: a
// fresh block comes from mmap and faults its pages in one by one as the
// tiles first touch them, which on the 2-core test VM cost a bf16 call at
// T = 16K, D = 128 (whose fp32 accumulators are 64 MiB per tensor) about
// a tenth of its time (docs/results/kernel_bench.md). PyTorch's caching
// allocator and oneDNN's scratchpad keep memory for the same reason.
//
//   ScratchPtr p = Scratch(n);   // n floats, 64-byte aligned
//   ...                          // returned to the cache when p goes
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
// Most bytes of free blocks the cache holds between calls.
inline constexpr size_t kCachedScratchBytes = size_t{512} << 20;
// Smaller blocks are not cached (malloc serves them from its heap).
inline constexpr size_t kMinCachedScratchBytes = size_t{1} << 20;

struct ScratchDeleter {
  size_t capacity = 0;  // floats
  void operator()(float* p) const;
};
using ScratchPtr = std::unique_ptr<float[], ScratchDeleter>;

// n floats (at least one), uninitialized (NaN under a sanitizer).
ScratchPtr Scratch(size_t n);

// Bytes of free blocks the cache holds now (tests).
size_t CachedScratchBytes();

}  // namespace hsap::kernels::cpu::internal

#endif  // HSAP_KERNELS_CPU_SCRATCH_H_

// Internal to kernels/cpu: the scratch buffers of one kernel call.
//
// A call's scratch is left uninitialized: the tiles overwrite every element
// they hand on (a tile that sees nothing writes nothing and is not merged).
// Sanitized builds fill it with NaN, so that a read of an element no tile
// wrote shows in the results (the ASan stage runs the kernel and numerics
// suites).
//
// Blocks asked for with `keep` (the fp32 accumulators VarlenForward and
// VarlenBackward allocate for a bf16/fp16 output, 64-128 MiB at T = 16K)
// are kept when the call ends, up to kCachedScratchBytes (512 MiB) in all,
// and handed to the next such call that fits: a fresh block comes from
// mmap and faults its pages in one by one as the tiles first touch them,
// which on the 2-core test VM cost a bf16 call at T = 16K a tenth to a
// fifth of its time (docs/results/kernel_bench.md). Other scratch (packed
// operands, wave slots: a few MiB) is freed at once: with every block
// cached, a daemon serving calls of many sizes grew by 10-14 % over
// tests/integration/load_test.cc (its bound: 10 %), and hsapd never calls
// the Varlen functions. PyTorch's caching allocator keeps memory for the same reason.
//
//   ScratchPtr p = Scratch(n);               // n floats, 64-byte aligned, freed
//   ScratchPtr acc = Scratch(n, /*keep=*/true);  // returned to the cache
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
  bool keep = false;    // back to the cache
  void operator()(float* p) const;
};
using ScratchPtr = std::unique_ptr<float[], ScratchDeleter>;

// n floats (at least one), uninitialized (NaN under a sanitizer); with
// `keep`, from and back to the cache.
ScratchPtr Scratch(size_t n, bool keep = false);

// Bytes of free blocks the cache holds now (tests).
size_t CachedScratchBytes();

}  // namespace hsap::kernels::cpu::internal

#endif  // HSAP_KERNELS_CPU_SCRATCH_H_

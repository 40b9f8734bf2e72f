// A CPU emulation of the CUDA features the attention kernels use, so that the
// very kernel source (forward_kernel.cuh, backward_kernel.cuh) runs in a
// plain C++ test on a machine without a GPU (tests/gpu/kernel_emulation_test).
// Test-only; compiled with HSAP_CUDA_EMULATION defined, by g++, never nvcc.
//
// Model: one cooperative fiber (Boost.Context) per CUDA thread, all on the
// calling thread; a CTA's fibers run together, CTAs one after another (so one
// static buffer serves as shared memory, refilled with 0xff bytes before each
// CTA to expose reads of unwritten data). __syncthreads is a CTA barrier;
// warp-collective operations (shuffles, ldmatrix, mma.sync) deposit each
// lane's operands in a per-warp exchange slot, then wait at a warp barrier.
// ldmatrix and mma.sync follow the PTX ISA's fragment tables (the same
// reading as fragment_layout_test.cc); mma sums in fp32. A cp.async copy
// lands when its thread waits for its group, not before. What this cannot
// show: races the real memory model allows beyond that, timing, occupancy,
// and any misreading of the ISA shared with the kernels.
#ifndef HSAP_KERNELS_CUDA_EMULATION_H_
#define HSAP_KERNELS_CUDA_EMULATION_H_

#if !defined(HSAP_CUDA_EMULATION) || defined(__CUDACC__)
#error "emulation.h is for host builds with HSAP_CUDA_EMULATION"
#endif

#include <cuda_runtime.h>  // uint3, float2, make_float2 (host parts only)

#include <boost/context/fiber.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"

// Launch bounds mean nothing to the CPU (and host_defines.h leaves the name
// undefined outside nvcc).
#undef __launch_bounds__
#define __launch_bounds__(...)

namespace hsap::kernels::cuda::emu {

// Cooperative fibers on the calling thread: one per CUDA thread of the CTA
// being run. A fiber that must wait yields to the next unfinished one, round
// robin; there is no preemption and no OS-thread parallelism, so runs are
// deterministic and a wait costs a context switch, not a futex. The switch
// is Boost.Context's (a few registers saved in user space): glibc's
// swapcontext, used before, also saved the signal mask with a system call
// on every switch, which was 76 % of the emulated tests' time (perf,
// 2026-12-06; docs/results/test_suite.md).
struct Fiber {
  boost::context::fiber context;  // where it resumes; empty while it runs
  bool done = false;
};

// Fiber stacks, kept for the process so that CTAs and launches reuse them
// (allocating and faulting in a fresh stack per fiber per CTA dominated the
// emulation's time).
inline std::vector<std::unique_ptr<char[]>>& FiberStacks() {
  static auto* stacks = new std::vector<std::unique_ptr<char[]>>;
  return *stacks;
}
inline constexpr size_t kFiberStackBytes = 64 * 1024;  // the kernels' locals need a few KB

// Boost.Context's stack allocator concept over one of FiberStacks(): the
// stack outlives the fiber, so deallocation leaves it for the next CTA.
struct ReusedStack {
  char* base;
  boost::context::stack_context allocate() {
    boost::context::stack_context sc;
    sc.size = kFiberStackBytes;
    sc.sp = base + kFiberStackBytes;  // stacks grow down
    return sc;
  }
  void deallocate(boost::context::stack_context&) {}
};

struct Scheduler {
  boost::context::fiber main;  // the launcher, while a fiber runs
  std::vector<Fiber> fibers;
  int current = 0;
  int switched_from = -1;  // the fiber that made the last switch; -1: main
};

inline Scheduler*& CurrentScheduler() {
  static Scheduler* scheduler = nullptr;
  return scheduler;
}

inline void SetBuiltins(int fiber);

// Keeps the context that has just switched to this fiber, so that it can be
// resumed later (Boost.Context hands it over as the result of resume()).
inline void Arrived(boost::context::fiber&& from) {
  Scheduler& s = *CurrentScheduler();
  if (s.switched_from < 0) {
    s.main = std::move(from);
  } else {
    s.fibers[s.switched_from].context = std::move(from);
  }
}

// Switches to the next unfinished fiber (returns at once if there is none).
inline void Yield() {
  Scheduler& s = *CurrentScheduler();
  const int n = static_cast<int>(s.fibers.size());
  const int from = s.current;
  for (int step = 1; step < n; ++step) {
    const int to = (from + step) % n;
    if (s.fibers[to].done) continue;
    s.current = to;
    s.switched_from = from;
    SetBuiltins(to);
    Arrived(std::move(s.fibers[to].context).resume());
    s.current = from;
    SetBuiltins(from);
    return;
  }
}

// A reusable barrier for `count` fibers.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    const int64_t generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      return;
    }
    while (generation_ == generation) Yield();
  }

 private:
  const int count_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

// Per-warp exchange area, double-buffered: each lane alternates slots
// between consecutive collectives, so one barrier per collective suffices
// (a lane writes slot n+1 only after every lane arrived at barrier n, and
// gets back to slot n only after every lane has read it and arrived at
// barrier n+1).
struct WarpState {
  Barrier barrier{32};
  struct Slot {
    const void* ptr[32];
    uint32_t regs[32][6];
    float value[32];
  } slot[2];
  int next_slot[32] = {};  // per lane
};

// cp.async as the hardware orders it: a copy lands only when its issuing
// thread waits for its group (cp.async.wait_group), so a read of shared
// memory that is missing a wait or the barrier after it sees the 0xff
// poison instead of data.
struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
};
struct ThreadCopies {
  std::vector<PendingCopy> open;                 // not yet committed
  std::vector<std::vector<PendingCopy>> groups;  // committed, oldest first
};

struct CtaState {
  explicit CtaState(int threads) : barrier(threads), copies(threads) {
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<WarpState>());
  }
  Barrier barrier;
  std::vector<std::unique_ptr<WarpState>> warps;
  std::vector<ThreadCopies> copies;  // per thread
};

inline CtaState* tl_cta = nullptr;
inline int tl_thread = 0;

inline WarpState& Warp() { return *tl_cta->warps[tl_thread / 32]; }
inline int Lane() { return tl_thread % 32; }
// This lane's slot for its next collective.
inline WarpState::Slot& NextSlot() {
  WarpState& w = Warp();
  const int l = Lane();
  WarpState::Slot& slot = w.slot[w.next_slot[l]];
  w.next_slot[l] ^= 1;
  return slot;
}

// Shared memory of the CTA being run (see kernel::smem_raw below).
inline constexpr size_t kSharedBytes = 232448;

}  // namespace hsap::kernels::cuda::emu

// The built-in variables and functions kernels name, in the global namespace.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

inline void __syncthreads() { hsap::kernels::cuda::emu::tl_cta->barrier.Wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { hsap::kernels::cuda::emu::Warp().barrier.Wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  auto& slot = hsap::kernels::cuda::emu::NextSlot();
  const int l = hsap::kernels::cuda::emu::Lane();
  slot.value[l] = v;
  hsap::kernels::cuda::emu::Warp().barrier.Wait();
  return slot.value[l ^ lane_mask];
}
// Fibers never run concurrently: a plain read-modify-write is atomic here.
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}

namespace hsap::kernels::cuda::kernel {
// The kernels' `extern __shared__ unsigned char smem_raw[]` binds to this.
alignas(16) inline unsigned char smem_raw[emu::kSharedBytes];
}  // namespace hsap::kernels::cuda::kernel

namespace hsap::kernels::cuda::emu {

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16; `p` is this lane's row.
template <bool kTrans>
void LdMatrixX4(uint32_t r[4], const void* p) {
  WarpState::Slot& slot = NextSlot();
  const int l = Lane();
  slot.ptr[l] = p;
  Warp().barrier.Wait();
  for (int i = 0; i < 4; ++i) {
    auto row = [&](int rr) { return static_cast<const uint16_t*>(slot.ptr[8 * i + rr]); };
    uint16_t lo, hi;
    if (!kTrans) {
      lo = row(l / 4)[2 * (l % 4)];
      hi = row(l / 4)[2 * (l % 4) + 1];
    } else {
      lo = row(2 * (l % 4))[l / 4];
      hi = row(2 * (l % 4) + 1)[l / 4];
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: c += A * B.
inline void Mma(float c[4], const uint32_t a[4], const uint32_t b[2], bool is_bf16) {
  WarpState::Slot& w = NextSlot();
  const int l = Lane();
  for (int k = 0; k < 4; ++k) w.regs[l][k] = a[k];
  w.regs[l][4] = b[0];
  w.regs[l][5] = b[1];
  Warp().barrier.Wait();
  auto decode = [&](uint32_t reg, int half) {
    const uint16_t bits = static_cast<uint16_t>(half ? reg >> 16 : reg & 0xffffu);
    return is_bf16 ? Bf16ToFloat(bits) : Fp16ToFloat(bits);
  };
  const int row0 = l / 4, col0 = 2 * (l % 4);
  float A[2][16], B[16][2];  // the two rows and two columns this lane needs
  for (int x = 0; x < 32; ++x) {
    const int g = x / 4, t = x % 4;
    for (int h = 0; h < 2; ++h) {
      if (g == row0) {
        A[0][2 * t + h] = decode(w.regs[x][0], h);
        A[0][2 * t + 8 + h] = decode(w.regs[x][2], h);
        A[1][2 * t + h] = decode(w.regs[x][1], h);
        A[1][2 * t + 8 + h] = decode(w.regs[x][3], h);
      }
      if (g == col0 || g == col0 + 1) {
        B[2 * t + h][g - col0] = decode(w.regs[x][4], h);
        B[2 * t + 8 + h][g - col0] = decode(w.regs[x][5], h);
      }
    }
  }
  for (int e = 0; e < 4; ++e) {
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += A[e / 2][k] * B[k][e & 1];
    c[e] = sum;
  }
}

inline void CpAsync16(void* dst, const void* src, bool valid) {
  tl_cta->copies[tl_thread].open.push_back({dst, src, valid});
}
inline void CpAsyncCommit() {
  ThreadCopies& c = tl_cta->copies[tl_thread];
  c.groups.push_back(std::move(c.open));
  c.open.clear();
}
// Completes this thread's committed groups but the newest `pending`.
inline void CpAsyncWait(int pending) {
  ThreadCopies& c = tl_cta->copies[tl_thread];
  while (static_cast<int>(c.groups.size()) > pending) {
    for (const PendingCopy& p : c.groups.front()) {
      if (p.valid) {
        std::memcpy(p.dst, p.src, 16);
      } else {
        std::memset(p.dst, 0, 16);
      }
    }
    c.groups.erase(c.groups.begin());
  }
}

inline void SetBuiltins(int fiber) {
  tl_thread = fiber;
  threadIdx = {static_cast<unsigned>(fiber), 0, 0};
}

// Runs body() as `threads` fibers of each CTA of a (grid_x, grid_y) grid,
// CTAs one after another, on the calling thread.
inline void Launch(int grid_x, int grid_y, int threads, const std::function<void()>& body) {
  static const std::function<void()>* entry = nullptr;
  entry = &body;
  for (int y = 0; y < grid_y; ++y) {
    for (int x = 0; x < grid_x; ++x) {
      std::memset(kernel::smem_raw, 0xff, sizeof(kernel::smem_raw));
      CtaState cta(threads);
      Scheduler s;
      s.fibers.resize(threads);
      CurrentScheduler() = &s;
      tl_cta = &cta;
      blockIdx = {static_cast<unsigned>(x), static_cast<unsigned>(y), 0};
      blockDim = dim3(threads, 1, 1);
      gridDim = dim3(grid_x, grid_y, 1);
      std::vector<std::unique_ptr<char[]>>& stacks = FiberStacks();
      while (stacks.size() < static_cast<size_t>(threads)) {
        stacks.emplace_back(new char[kFiberStackBytes]);
      }
      for (int t = 0; t < threads; ++t) {
        s.fibers[t].context = boost::context::fiber(
            std::allocator_arg, ReusedStack{stacks[t].get()}, [](boost::context::fiber&& from) {
              Arrived(std::move(from));
              (*entry)();
              Scheduler& sched = *CurrentScheduler();
              sched.fibers[sched.current].done = true;
              return std::move(sched.main);  // back to the loop below
            });
      }
      // Only a finishing fiber returns here (the others switch among
      // themselves); resume the next unfinished one.
      int remaining = threads;
      s.current = 0;
      while (remaining > 0) {
        while (s.fibers[s.current].done) s.current = (s.current + 1) % threads;
        s.switched_from = -1;
        SetBuiltins(s.current);
        // What comes back is the finished fiber's (empty) context.
        std::move(s.fibers[s.current].context).resume();
        --remaining;
      }
      CurrentScheduler() = nullptr;
    }
  }
}

}  // namespace hsap::kernels::cuda::emu

#endif  // HSAP_KERNELS_CUDA_EMULATION_H_

// kernel_bench: useful GFLOP/s of the CPU attention kernels as a share of
// the machine's FMA peak and of its fp32 GEMM rate, all measured in the same
// run on the same threads, on every SIMD target the kernels dispatch to.
//
// Per SIMD target (the dispatcher pinned to it with
// hwy::SetSupportedTargetsForTest, as attention_test does):
//  * FMA peak: every thread runs independent chains of vector FMAs (more
//    chains than latency x issue width, so the FMA units never wait), the
//    best of several 20 ms trials: the machine's limit at that vector width.
//    Measured at the start of each target (best of 15: the "run peak") and
//    beside every shape (best of 3 before each forward and each backward
//    repetition, the median of those: the "peak near" it). Each kernel is
//    reported against the peak near it: on the shared test VM the same
//    FMA loop reads 421-453 GFLOP/s from one run to the next, and a share
//    against a peak taken minutes earlier would measure that drift.
//  * GEMM rate: fp32 C = A B at 1920^3, the larger of this file's own
//    blocked Highway sgemm at that target and OpenBLAS (dlopen'ed after
//    setting OPENBLAS_CORETYPE for the detected CPU: Debian's DYNAMIC_ARCH
//    build otherwise may pick a generic core; OpenBLAS runs its own kernels
//    whatever the target, so it is a reference figure), the best of all
//    runs.
//  * Attention: fp32 and bf16 x D in {32, 64, 128, 256} x MHA (Hq = Hkv = 8)
//    and GQA 4:1 (Hq = 8, Hkv = 2) x two masks: the first --tokens pack of
//    workloads/python-stdlib.tokens (common/workload.h: shuffled with
//    --seed, concatenated, cut), causal per document; and one full
//    (bidirectional) document of --full_tokens. Useful FLOPs count each
//    allowed (q, k) pair once: forward 4 * area * Hq * D, backward
//    10 * area * Hq * D. Medians of --reps repetitions after one warm-up
//    forward.
//
// Peaks and GEMM are best-of figures, the kernels medians, so load from
// other work on the machine can only lower the shares. The load average is
// printed at the start and the end. The last three lines are
//   fwd_vs_gemm=<min> bwd_vs_gemm=<min>
//   fwd_vs_run_peak=<min> bwd_vs_run_peak=<min>
//   fwd_vs_peak=<min> bwd_vs_peak=<min>
// the minimum over every shape and target measured, against the GEMM rate,
// the run peak and the peak near each shape.
//
//   bazel run //bench:kernel_bench -- --threads=2 --reps=3
//   bazel run //bench:kernel_bench -- --targets=AVX2 --dims=128 --dtypes=bf16

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/kernel_bench.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target must come first.
#include "hwy/highway.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/mask.h"
#include "common/workload.h"
#include "hwy/aligned_allocator.h"
#include "hwy/targets.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/tile_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace hsap::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------
// FMA throughput: kChains independent accumulators, each updated by one FMA
// per step. 12 chains fill the FMA units of every x86 target (Zen 4, Intel:
// latency 4 x 2 units of 8 lanes, or 1 unit of 16) and fit the 16 registers
// of AVX2 next to the two operands. Returns a value so nothing is elided.
constexpr int kChains = 12;

HWY_NOINLINE float FmaChains(int64_t steps) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, 0.9999999f), c = hn::Set(d, 1e-7f);
  auto a0 = hn::Set(d, 1.f), a1 = hn::Set(d, 2.f), a2 = hn::Set(d, 3.f), a3 = hn::Set(d, 4.f);
  auto a4 = hn::Set(d, 5.f), a5 = hn::Set(d, 6.f), a6 = hn::Set(d, 7.f), a7 = hn::Set(d, 8.f);
  auto a8 = hn::Set(d, 9.f), a9 = hn::Set(d, 10.f), a10 = hn::Set(d, 11.f), a11 = hn::Set(d, 12.f);
  for (int64_t s = 0; s < steps; ++s) {
    a0 = hn::MulAdd(a0, m, c); a1 = hn::MulAdd(a1, m, c); a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c); a4 = hn::MulAdd(a4, m, c); a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c); a7 = hn::MulAdd(a7, m, c); a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c); a10 = hn::MulAdd(a10, m, c); a11 = hn::MulAdd(a11, m, c);
  }
  auto sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                     hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  sum = hn::Add(sum, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

size_t FloatLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

// FLOPs of one FmaChains step.
double FmaChainsStepFlops() { return 2.0 * kChains * FloatLanes(); }

// ---------------------------------------------------------------------------
// Blocked SIMD sgemm: C[M, N] = A[M, K] B[K, N], row-major, M % 96 == 0,
// N % (2 * lanes) == 0. Packed A panels of 6 rows, packed B panels of two
// vectors, kc = 256, 6 x 2-vector register tile.
constexpr int kMr = 6;

size_t PanelWidth() { return 2 * hn::Lanes(hn::ScalableTag<float>()); }

// C[6, 2N] += Ap[k][6] * Bp[k][2N] over kc steps.
void MicroKernel6(const float* HWY_RESTRICT ap, const float* HWY_RESTRICT bp, int kc,
                  float* HWY_RESTRICT c, int64_t ldc) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto c00 = hn::LoadU(d, c + 0 * ldc), c01 = hn::LoadU(d, c + 0 * ldc + N);
  auto c10 = hn::LoadU(d, c + 1 * ldc), c11 = hn::LoadU(d, c + 1 * ldc + N);
  auto c20 = hn::LoadU(d, c + 2 * ldc), c21 = hn::LoadU(d, c + 2 * ldc + N);
  auto c30 = hn::LoadU(d, c + 3 * ldc), c31 = hn::LoadU(d, c + 3 * ldc + N);
  auto c40 = hn::LoadU(d, c + 4 * ldc), c41 = hn::LoadU(d, c + 4 * ldc + N);
  auto c50 = hn::LoadU(d, c + 5 * ldc), c51 = hn::LoadU(d, c + 5 * ldc + N);
  for (int k = 0; k < kc; ++k) {
    const auto b0 = hn::Load(d, bp), b1 = hn::Load(d, bp + N);
    auto a = hn::Set(d, ap[0]);
    c00 = hn::MulAdd(a, b0, c00); c01 = hn::MulAdd(a, b1, c01);
    a = hn::Set(d, ap[1]);
    c10 = hn::MulAdd(a, b0, c10); c11 = hn::MulAdd(a, b1, c11);
    a = hn::Set(d, ap[2]);
    c20 = hn::MulAdd(a, b0, c20); c21 = hn::MulAdd(a, b1, c21);
    a = hn::Set(d, ap[3]);
    c30 = hn::MulAdd(a, b0, c30); c31 = hn::MulAdd(a, b1, c31);
    a = hn::Set(d, ap[4]);
    c40 = hn::MulAdd(a, b0, c40); c41 = hn::MulAdd(a, b1, c41);
    a = hn::Set(d, ap[5]);
    c50 = hn::MulAdd(a, b0, c50); c51 = hn::MulAdd(a, b1, c51);
    ap += kMr;
    bp += 2 * N;
  }
  hn::StoreU(c00, d, c + 0 * ldc); hn::StoreU(c01, d, c + 0 * ldc + N);
  hn::StoreU(c10, d, c + 1 * ldc); hn::StoreU(c11, d, c + 1 * ldc + N);
  hn::StoreU(c20, d, c + 2 * ldc); hn::StoreU(c21, d, c + 2 * ldc + N);
  hn::StoreU(c30, d, c + 3 * ldc); hn::StoreU(c31, d, c + 3 * ldc + N);
  hn::StoreU(c40, d, c + 4 * ldc); hn::StoreU(c41, d, c + 4 * ldc + N);
  hn::StoreU(c50, d, c + 5 * ldc); hn::StoreU(c51, d, c + 5 * ldc + N);
}

void Sgemm(int64_t M, int64_t N, int64_t K, const float* a, const float* b, float* c,
           kernels::cpu::ThreadPool* pool) {
  constexpr int kKc = 256, kMc = 96;
  const int64_t nr = static_cast<int64_t>(PanelWidth());
  std::fill(c, c + M * N, 0.f);
  auto bp = hwy::AllocateAligned<float>(static_cast<size_t>(kKc) * N);
  const int64_t m_blocks = M / kMc;
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int kc = static_cast<int>(std::min<int64_t>(kKc, K - k0));
    // B[k0:k0+kc, :] into panels [N / nr][kc][nr].
    pool->ParallelFor(N / nr, [&](int64_t p) {
      float* dst = bp.get() + p * kc * nr;
      for (int k = 0; k < kc; ++k) {
        std::memcpy(dst + k * nr, b + (k0 + k) * N + p * nr, nr * sizeof(float));
      }
    });
    pool->ParallelFor(m_blocks, [&](int64_t mb) {
      thread_local hwy::AlignedFreeUniquePtr<float[]> ap;
      if (!ap) ap = hwy::AllocateAligned<float>(static_cast<size_t>(kMc) * kKc);
      const int64_t m0 = mb * kMc;
      for (int r0 = 0; r0 < kMc; r0 += kMr) {  // A block into panels [kMc / 6][kc][6]
        float* dst = ap.get() + r0 * kc;
        for (int k = 0; k < kc; ++k) {
          for (int r = 0; r < kMr; ++r) dst[k * kMr + r] = a[(m0 + r0 + r) * K + k0 + k];
        }
      }
      for (int64_t p = 0; p < N / nr; ++p) {
        for (int r0 = 0; r0 < kMc; r0 += kMr) {
          MicroKernel6(ap.get() + r0 * kc, bp.get() + p * kc * nr, kc,
                       c + (m0 + r0) * N + p * nr, N);
        }
      }
    });
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hsap::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace hsap::bench {
namespace {

HWY_EXPORT(Sgemm);
HWY_EXPORT(FmaChains);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(FmaChainsStepFlops);

using kernels::cpu::AttentionShape;
using kernels::cpu::ThreadPool;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The 1-minute load average: other work on the machine skews every rate.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "?" : one;
}

// The FMA peak of `pool`'s threads at the dispatched target, GFLOP/s. The
// work is cut in 16 pieces per thread so that dynamic scheduling keeps
// every thread busy to the end; CalibrateFma picks the piece that takes
// about 20 ms, FmaPeak returns the best of `trials` runs of it.
struct FmaWork {
  int64_t pieces = 0;
  int64_t steps = 0;
};

FmaWork CalibrateFma(ThreadPool* pool, int threads) {
  FmaWork w{16 * int64_t{threads}, 1 << 12};
  for (;;) {
    const double s = Seconds([&] {
      pool->ParallelFor(w.pieces, [&](int64_t) { HWY_DYNAMIC_DISPATCH(FmaChains)(w.steps); });
    });
    if (s > 0.02 || w.steps > (int64_t{1} << 30)) break;
    w.steps *= 2;
  }
  return w;
}

double FmaPeak(ThreadPool* pool, const FmaWork& w, int trials) {
  const double flops = HWY_DYNAMIC_DISPATCH(FmaChainsStepFlops)() * w.steps * w.pieces;
  double best = 0;
  volatile float sink = 0;
  for (int t = 0; t < trials; ++t) {
    const double s = Seconds([&] {
      pool->ParallelFor(w.pieces, [&](int64_t) { sink = HWY_DYNAMIC_DISPATCH(FmaChains)(w.steps); });
    });
    best = std::max(best, flops / s * 1e-9);
  }
  return best;
}

// OPENBLAS_CORETYPE for this CPU (Debian's OpenBLAS is a DYNAMIC_ARCH build).
const char* OpenBlasCoreType() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  return nullptr;
}

// fp32 GEMM C = A B at 1920^3 with the own sgemm (at the dispatched target)
// and, when present, OpenBLAS, on the same threads as the attention kernels.
class GemmBench {
 public:
  static constexpr int64_t kSize = 1920;  // multiple of 96 and of 32

  GemmBench(ThreadPool* pool, int threads)
      : pool_(pool), a_(kSize * kSize), b_(kSize * kSize), c_(kSize * kSize),
        c_blas_(kSize * kSize) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& x : a_) x = u(rng);
    for (float& x : b_) x = u(rng);
    // Must be set before the library loads: it reads them once.
    if (const char* core = OpenBlasCoreType()) setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/0);
    setenv("OPENBLAS_NUM_THREADS", std::to_string(threads).c_str(), 1);
    void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    sgemm_ = reinterpret_cast<SgemmFn>(dlsym(lib, "cblas_sgemm"));
    auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(lib, "openblas_set_num_threads"));
    auto corename = reinterpret_cast<char* (*)()>(dlsym(lib, "openblas_get_corename"));
    if (set_threads != nullptr) set_threads(threads);
    blas_core_ = corename != nullptr ? corename() : "?";
  }

  bool has_blas() const { return sgemm_ != nullptr; }
  const std::string& blas_core() const { return blas_core_; }

  // GFLOP/s of one call.
  double OwnOnce() {
    return Rate([&] {
      HWY_DYNAMIC_DISPATCH(Sgemm)(kSize, kSize, kSize, a_.data(), b_.data(), c_.data(), pool_);
    });
  }
  double BlasOnce() {
    if (!has_blas()) return 0;
    constexpr int kRowMajor = 101, kNoTrans = 111;
    return Rate([&] {
      sgemm_(kRowMajor, kNoTrans, kNoTrans, kSize, kSize, kSize, 1.f, a_.data(), kSize,
             b_.data(), kSize, 0.f, c_blas_.data(), kSize);
    });
  }

  // Exits if the own sgemm and OpenBLAS disagree (one rate would be meaningless).
  void CheckAgreement() const {
    if (!has_blas()) return;
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < c_.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(c_[i] - c_blas_[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(c_blas_[i])));
    }
    if (max_diff > 1e-4 * max_ref) {
      std::fprintf(stderr, "own sgemm disagrees with OpenBLAS: %g of %g\n", max_diff, max_ref);
      std::exit(1);
    }
  }

 private:
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                           int, float, float*, int);
  double Rate(const std::function<void()>& fn) {
    return 2.0 * kSize * kSize * kSize / Seconds(fn) * 1e-9;
  }

  ThreadPool* pool_;
  std::vector<float> a_, b_, c_, c_blas_;
  SgemmFn sgemm_ = nullptr;
  std::string blas_core_;
};

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Options {
  std::string workload = FindWorkload();
  int64_t tokens = 16384;      // the causal pack (7 documents at seed 2026)
  int64_t full_tokens = 4096;  // the one full document
  int threads = 2;
  int reps = 3;
  uint64_t seed = 2026;
  std::vector<std::string> targets;  // empty: every target this CPU runs
  std::vector<std::string> dtypes = {"fp32", "bf16"};
  std::vector<int> dims = {32, 64, 128, 256};
  std::vector<std::string> heads = {"mha", "gqa"};
  std::vector<std::string> masks = {"causal", "full"};
};

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: kernel_bench [--workload=FILE] [--tokens=16384] [--full_tokens=4096] "
               "[--threads=2] [--reps=3] [--seed=2026] [--targets=AVX3,AVX2,...] "
               "[--dtypes=fp32,bf16] [--dims=32,64,128,256] [--heads=mha,gqa] "
               "[--masks=causal,full]\n");
  std::exit(2);
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("workload")) o.workload = v;
    else if (const char* v = value("tokens")) o.tokens = std::atoll(v);
    else if (const char* v = value("full_tokens")) o.full_tokens = std::atoll(v);
    else if (const char* v = value("threads")) o.threads = std::max(1, std::atoi(v));
    else if (const char* v = value("reps")) o.reps = std::max(1, std::atoi(v));
    else if (const char* v = value("seed")) o.seed = std::strtoull(v, nullptr, 10);
    else if (const char* v = value("targets")) o.targets = SplitList(v);
    else if (const char* v = value("dtypes")) o.dtypes = SplitList(v);
    else if (const char* v = value("heads")) o.heads = SplitList(v);
    else if (const char* v = value("masks")) o.masks = SplitList(v);
    else if (const char* v = value("dims")) {
      o.dims.clear();
      for (const std::string& d : SplitList(v)) o.dims.push_back(std::atoi(d.c_str()));
    } else {
      Usage();
    }
  }
  for (const std::string& h : o.heads) {
    if (h != "mha" && h != "gqa") Usage();
  }
  for (const std::string& m : o.masks) {
    if (m != "causal" && m != "full") Usage();
  }
  for (int d : o.dims) {
    if (d < 1 || d > 256) Usage();
  }
  if (o.tokens < 1 || o.full_tokens < 1) Usage();
  return o;
}

// Fills n elements of `dtype` with uniform values in [-1, 1) (splitmix64).
void FillRandom(void* base, DType dtype, int64_t n, uint64_t seed) {
  uint64_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    StoreFromFloat(base, dtype, i, static_cast<float>(z >> 40) * 0x1p-23f - 1.f);
  }
}

struct Mask {
  std::string name;
  int64_t tokens;
  std::vector<MaskSlice> slices;
  int64_t area = 0;
};

struct Row {
  std::string target, mask;
  DType dtype;
  int hq, hkv, head_dim;
  double fwd, bwd;  // GFLOP/s, medians
  double peak;      // the FMA peak measured beside the shape's repetitions
  double run_peak;  // the target's best-of-15 peak at the start of the run
  double gemm;
};

// Forward and backward of one shape, medians of `reps`.
Row MeasureShape(const Mask& mask, DType dtype, int hq, int hkv, int head_dim, int reps,
                 ThreadPool* pool, const FmaWork& fma) {
  AttentionShape shape{hq, hkv, head_dim, dtype,
                       1.f / std::sqrt(static_cast<float>(head_dim))};
  const int64_t T = mask.tokens;
  const int64_t nq = T * hq * head_dim, nkv = T * hkv * head_dim;
  const size_t es = DTypeSize(dtype);
  std::vector<uint8_t> q(nq * es), k(nkv * es), v(nkv * es), o(nq * es), dout(nq * es),
      dq(nq * es), dk(nkv * es), dv(nkv * es);
  FillRandom(q.data(), dtype, nq, 1);
  FillRandom(k.data(), dtype, nkv, 2);
  FillRandom(v.data(), dtype, nkv, 3);
  FillRandom(dout.data(), dtype, nq, 4);
  std::vector<float> lse(static_cast<size_t>(hq) * T);
  auto forward = [&] {
    kernels::cpu::VarlenForward(shape, q.data(), k.data(), v.data(), T, T, mask.slices,
                                o.data(), lse.data(), pool);
  };
  auto backward = [&] {
    kernels::cpu::VarlenBackward(shape, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                 dout.data(), T, T, mask.slices, dq.data(), dk.data(),
                                 dv.data(), pool);
  };
  forward();  // warm-up; also produces the O and LSE the backward reads
  const double unit = static_cast<double>(mask.area) * hq * head_dim * 1e-9;
  std::vector<double> fwd, bwd, peaks;
  for (int r = 0; r < reps; ++r) {
    peaks.push_back(FmaPeak(pool, fma, 3));
    fwd.push_back(4 * unit / Seconds(forward));
    peaks.push_back(FmaPeak(pool, fma, 3));
    bwd.push_back(10 * unit / Seconds(backward));
  }
  Row row;
  row.mask = mask.name;
  row.dtype = dtype;
  row.hq = hq;
  row.hkv = hkv;
  row.head_dim = head_dim;
  row.fwd = Median(fwd);
  row.bwd = Median(bwd);
  row.peak = Median(peaks);
  return row;
}

int Main(int argc, char** argv) {
  const Options opt = ParseOptions(argc, argv);
  ThreadPool pool(opt.threads);
  const std::string load_before = LoadAverage();

  // The masks.
  const auto lengths = LoadDocumentLengths(opt.workload);
  if (!lengths.ok()) {
    std::fprintf(stderr, "%s\n", std::string(lengths.status().message()).c_str());
    return 1;
  }
  std::vector<Mask> masks;
  for (const std::string& name : opt.masks) {
    Mask m;
    m.name = name;
    if (name == "causal") {
      m.tokens = opt.tokens;
      const auto packs = PackDocuments(*lengths, opt.tokens, 1, opt.seed);
      m.slices = LowerDocuments(packs[0], /*causal=*/true, /*window=*/-1);
    } else {
      m.tokens = opt.full_tokens;
      m.slices = LowerDocuments(std::vector<int64_t>{0, opt.full_tokens}, /*causal=*/false, -1);
    }
    for (const MaskSlice& s : m.slices) m.area += SliceArea(s);
    masks.push_back(std::move(m));
  }

  // The targets: every one compiled into the kernels that this CPU runs
  // (best first), or those named.
  std::vector<int64_t> targets;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    const std::string name = hwy::TargetName(t);
    if (opt.targets.empty() ? (t & (HWY_EMU128 | HWY_SCALAR)) == 0
                            : std::find(opt.targets.begin(), opt.targets.end(), name) !=
                                  opt.targets.end()) {
      targets.push_back(t);
    }
  }
  if (targets.empty()) {
    std::fprintf(stderr, "none of the named targets runs on this CPU\n");
    return 1;
  }

  std::printf("kernel_bench: %d threads, median of %d reps, load average %s\n", opt.threads,
              opt.reps, load_before.c_str());
  for (const Mask& m : masks) {
    int64_t longest = 0;
    for (const MaskSlice& s : m.slices) longest = std::max(longest, s.num_q());
    std::printf("mask %s: T=%lld tokens, %zu %s documents (longest %lld), area %lld pairs\n",
                m.name.c_str(), static_cast<long long>(m.tokens), m.slices.size(),
                m.name == "causal" ? "causal" : "full", static_cast<long long>(longest),
                static_cast<long long>(m.area));
  }

  GemmBench gemm(&pool, opt.threads);
  gemm.BlasOnce();  // warm-up (and OpenBLAS thread start)
  std::vector<double> blas_rates;
  std::vector<Row> rows;
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    const int64_t target = targets[ti];
    hwy::SetSupportedTargetsForTest(target);
    const std::string ran = kernels::cpu::internal::SimdTargetName();
    const FmaWork fma = CalibrateFma(&pool, opt.threads);
    const double peak = FmaPeak(&pool, fma, 15);
    gemm.OwnOnce();  // warm-up
    if (ti == 0) gemm.CheckAgreement();
    double own = 0;
    for (int r = 0; r < 3; ++r) {
      own = std::max(own, gemm.OwnOnce());
      blas_rates.push_back(gemm.BlasOnce());
    }
    double blas = *std::max_element(blas_rates.begin(), blas_rates.end());
    std::printf("\ntarget %s (kernels ran %s, %zu fp32 lanes): FMA peak %.1f GFLOP/s; fp32 "
                "GEMM 1920^3: own sgemm %.1f, OpenBLAS %.1f GFLOP/s\n",
                hwy::TargetName(target), ran.c_str(), HWY_DYNAMIC_DISPATCH(FloatLanes)(), peak,
                own, blas);
    std::printf("%-6s %-8s %3s %3s %4s  %11s %11s  %8s %8s  %8s %8s  %9s\n", "mask", "dtype", "Hq",
                "Hkv", "D", "fwd GFLOP/s", "bwd GFLOP/s", "fwd/peak", "bwd/peak", "fwd/gemm",
                "bwd/gemm", "peak near");
    for (const Mask& m : masks) {
      for (const std::string& dt : opt.dtypes) {
        DType dtype;
        if (!ParseDType(dt, &dtype)) Usage();
        for (int D : opt.dims) {
          for (const std::string& h : opt.heads) {
            Row row = MeasureShape(m, dtype, 8, h == "mha" ? 8 : 2, D, opt.reps, &pool, fma);
            row.target = hwy::TargetName(target);
            row.run_peak = peak;
            blas_rates.push_back(gemm.BlasOnce());  // GEMM samples spread over the run
            blas = *std::max_element(blas_rates.begin(), blas_rates.end());
            row.gemm = std::max(own, blas);
            std::printf("%-6s %-8s %3d %3d %4d  %11.1f %11.1f  %8.3f %8.3f  %8.3f %8.3f  %9.1f\n",
                        row.mask.c_str(), std::string(DTypeName(row.dtype)).c_str(), row.hq,
                        row.hkv, row.head_dim, row.fwd, row.bwd, row.fwd / row.peak,
                        row.bwd / row.peak, row.fwd / row.gemm, row.bwd / row.gemm, row.peak);
            std::fflush(stdout);
            rows.push_back(row);
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);

  std::printf("\nOpenBLAS (core %s, OPENBLAS_CORETYPE=%s): best %.1f, median %.1f GFLOP/s of "
              "%zu runs\n",
              gemm.has_blas() ? gemm.blas_core().c_str() : "not found",
              getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset",
              *std::max_element(blas_rates.begin(), blas_rates.end()), Median(blas_rates),
              blas_rates.size());
  // The worst shape per target and over all.
  auto worst = [&](auto share) {
    const Row* w = &rows.front();
    for (const Row& r : rows) {
      if (share(r) < share(*w)) w = &r;
    }
    return w;
  };
  auto describe = [](const Row& r) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%s %s %s Hq=%d Hkv=%d D=%d", r.target.c_str(),
                  r.mask.c_str(), std::string(DTypeName(r.dtype)).c_str(), r.hq, r.hkv,
                  r.head_dim);
    return std::string(buf);
  };
  const Row* wf = worst([](const Row& r) { return r.fwd / r.peak; });
  const Row* wb = worst([](const Row& r) { return r.bwd / r.peak; });
  const Row* gf = worst([](const Row& r) { return r.fwd / r.gemm; });
  const Row* gb = worst([](const Row& r) { return r.bwd / r.gemm; });
  std::printf("worst forward: %s; worst backward: %s\n", describe(*wf).c_str(),
              describe(*wb).c_str());
  std::printf("load average at the end: %s\n", LoadAverage().c_str());
  std::printf("fwd_vs_gemm=%.3f bwd_vs_gemm=%.3f\n", gf->fwd / gf->gemm, gb->bwd / gb->gemm);
  const Row* rf = worst([](const Row& r) { return r.fwd / r.run_peak; });
  const Row* rb = worst([](const Row& r) { return r.bwd / r.run_peak; });
  std::printf("fwd_vs_run_peak=%.3f bwd_vs_run_peak=%.3f\n", rf->fwd / rf->run_peak,
              rb->bwd / rb->run_peak);
  std::printf("fwd_vs_peak=%.3f bwd_vs_peak=%.3f\n", wf->fwd / wf->peak, wb->bwd / wb->peak);
  return 0;
}

}  // namespace
}  // namespace hsap::bench

int main(int argc, char** argv) { return hsap::bench::Main(argc, argv); }
#endif  // HWY_ONCE

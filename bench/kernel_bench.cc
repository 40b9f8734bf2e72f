// kernel_bench: useful GFLOP/s of the CPU attention kernels next to the
// machine's fp32 GEMM rate, measured in the same run on the same threads.
//
// Workload: document lengths from a workloads file (one per line), shuffled
// with a fixed seed, concatenated and cut; the first T-token pack is used,
// causal per document (DESIGN.md §8 "mask area"). Useful FLOPs count each
// allowed (q, k) pair once: forward 4 * area * Hq * D, backward
// 10 * area * Hq * D, area = sum of SliceArea.
//
// GEMM rate: the larger of (a) this file's own blocked sgemm written with
// Highway at the CPU's real vector width (AVX2: 8 floats, AVX-512: 16) and
// (b) OpenBLAS, dlopen'ed after setting OPENBLAS_CORETYPE for the detected
// CPU (Debian's DYNAMIC_ARCH build otherwise may pick a generic core).
//
// Attention rates are medians of --reps repetitions, on --threads threads.
// The machine GEMM rate is the best of all GEMM runs (a median of 5+ per
// library at start, plus runs between the attention repetitions), so load
// from other work on the machine can only lower the ratios. The last line is
// `fwd_vs_gemm=<r> bwd_vs_gemm=<r>` for D = 128, fp32.
//
//   bazel run //bench:kernel_bench -- --threads=2 --reps=3

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
#include <string>
#include <vector>

#include "common/workload.h"
#include "hwy/aligned_allocator.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/tile_kernels.h"

// ---------------------------------------------------------------------------
// Blocked SIMD sgemm: C[M, N] = A[M, K] B[K, N], row-major, M % 96 == 0,
// N % (2 * lanes) == 0. Packed A panels of 6 rows, packed B panels of two
// vectors, kc = 256, 6 x 2-vector register tile (as the attention kernels).
HWY_BEFORE_NAMESPACE();
namespace hsap::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

using kernels::cpu::AttentionShape;
using kernels::cpu::ThreadPool;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// OPENBLAS_CORETYPE for this CPU (Debian's OpenBLAS is a DYNAMIC_ARCH build).
const char* OpenBlasCoreType() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  return nullptr;
}

// fp32 GEMM C = A B at 1920^3 with the own sgemm and (when present)
// OpenBLAS, on the same threads as the attention kernels.
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
  // The machine rate right now: the faster of the two.
  double BestOnce() { return std::max(OwnOnce(), BlasOnce()); }

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
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    return 2.0 * kSize * kSize * kSize / s * 1e-9;
  }

  ThreadPool* pool_;
  std::vector<float> a_, b_, c_, c_blas_;
  SgemmFn sgemm_ = nullptr;
  std::string blas_core_;
};

// The first `tokens`-token pack of the shuffled, concatenated documents.
std::vector<int64_t> PackCuSeqlens(const std::string& path, int64_t tokens, uint64_t seed) {
  std::ifstream in(path);
  std::vector<int64_t> lengths;
  for (int64_t len; in >> len;) {
    if (len > 0) lengths.push_back(len);
  }
  if (lengths.empty()) {
    std::fprintf(stderr, "no document lengths in %s\n", path.c_str());
    std::exit(1);
  }
  std::mt19937_64 rng(seed);
  std::shuffle(lengths.begin(), lengths.end(), rng);
  std::vector<int64_t> cu = {0};
  for (size_t i = 0; cu.back() < tokens; i = (i + 1) % lengths.size()) {
    cu.push_back(std::min(tokens, cu.back() + lengths[i]));
  }
  return cu;
}

struct Options {
  std::string workload = FindWorkload();
  int64_t tokens = 16384;
  int threads = 2;
  int reps = 3;
  uint64_t seed = 2026;
};

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
    else if (const char* v = value("threads")) o.threads = std::atoi(v);
    else if (const char* v = value("reps")) o.reps = std::max(1, std::atoi(v));
    else if (const char* v = value("seed")) o.seed = std::strtoull(v, nullptr, 10);
    else {
      std::fprintf(stderr,
                   "usage: kernel_bench [--workload=FILE] [--tokens=16384] [--threads=2] "
                   "[--reps=3] [--seed=2026]\n");
      std::exit(2);
    }
  }
  return o;
}

// The 1-minute load average: other work on the machine skews every rate.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one;
  in >> one;
  return one.empty() ? "?" : one;
}

int Main(int argc, char** argv) {
  const Options opt = ParseOptions(argc, argv);
  ThreadPool pool(opt.threads);
  const std::string load_before = LoadAverage();

  GemmBench gemm(&pool, opt.threads);
  gemm.OwnOnce();  // warm-up (and OpenBLAS thread start)
  gemm.BlasOnce();
  gemm.CheckAgreement();
  std::vector<double> own, blas_rate;
  for (int r = 0; r < std::max(opt.reps, 5); ++r) {
    own.push_back(gemm.OwnOnce());
    blas_rate.push_back(gemm.BlasOnce());
  }

  const std::vector<int64_t> cu = PackCuSeqlens(opt.workload, opt.tokens, opt.seed);
  const std::vector<MaskSlice> slices = LowerDocuments(cu, /*causal=*/true, /*window=*/-1);
  int64_t area = 0, longest = 0;
  for (const MaskSlice& s : slices) {
    area += SliceArea(s);
    longest = std::max(longest, s.num_q());
  }

  std::printf("kernel_bench: SIMD target %s, %d threads, median of %d reps, load average %s\n",
              kernels::cpu::internal::SimdTargetName(), opt.threads, opt.reps,
              load_before.c_str());
  std::printf("pack: T=%lld tokens, %zu causal documents (longest %lld), area %lld pairs\n",
              static_cast<long long>(opt.tokens), slices.size(), static_cast<long long>(longest),
              static_cast<long long>(area));
  struct Row {
    DType dtype;
    int head_dim;
    double fwd, bwd;  // GFLOP/s, medians
  };
  std::vector<double> gemm_samples;
  std::vector<Row> rows;
  const int kHeads = 8;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int D : {64, 128}) {
      AttentionShape shape{kHeads, kHeads, D, dtype, 1.f / std::sqrt(static_cast<float>(D))};
      const int64_t n = opt.tokens * kHeads * D;
      const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
      std::vector<uint8_t> q(bytes), k(bytes), v(bytes), o(bytes), dout(bytes), dq(bytes),
          dk(bytes), dv(bytes);
      std::mt19937 rng(11);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (auto* t : {&q, &k, &v, &dout}) {
        for (int64_t i = 0; i < n; ++i) StoreFromFloat(t->data(), dtype, i, u(rng));
      }
      std::vector<float> lse(static_cast<size_t>(kHeads) * opt.tokens);
      auto forward = [&] {
        kernels::cpu::VarlenForward(shape, q.data(), k.data(), v.data(), opt.tokens, opt.tokens,
                                    slices, o.data(), lse.data(), &pool);
      };
      auto backward = [&] {
        kernels::cpu::VarlenBackward(shape, q.data(), k.data(), v.data(), o.data(), lse.data(),
                                     dout.data(), opt.tokens, opt.tokens, slices, dq.data(),
                                     dk.data(), dv.data(), &pool);
      };
      auto seconds = [](const std::function<void()>& fn) {
        const auto start = Clock::now();
        fn();
        return std::chrono::duration<double>(Clock::now() - start).count();
      };
      forward();  // warm-up; also produces the O and LSE the backward reads
      backward();
      const double unit = static_cast<double>(area) * kHeads * D;
      // GEMM samples between the repetitions: the machine rate is the best
      // GEMM seen anywhere in the run, so a busy moment (other work on the
      // machine) can lower the ratios but never raise them.
      std::vector<double> fwd, bwd;
      for (int r = 0; r < opt.reps; ++r) {
        fwd.push_back(4 * unit / seconds(forward) * 1e-9);
        gemm_samples.push_back(gemm.BestOnce());
        bwd.push_back(10 * unit / seconds(backward) * 1e-9);
        gemm_samples.push_back(gemm.BestOnce());
      }
      rows.push_back({dtype, D, Median(fwd), Median(bwd)});
    }
  }

  char blas[96] = "not found";
  if (gemm.has_blas()) {
    std::snprintf(blas, sizeof(blas), "%.1f GFLOP/s (core %s, OPENBLAS_CORETYPE=%s)",
                  Median(blas_rate), gemm.blas_core().c_str(),
                  getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset");
  }
  std::printf("fp32 GEMM 1920^3 at start: own Highway sgemm %.1f GFLOP/s; OpenBLAS %s\n",
              Median(own), blas);
  const bool own_wins = Median(own) >= Median(blas_rate);
  for (double g : own) gemm_samples.push_back(g);
  for (double g : blas_rate) gemm_samples.push_back(g);
  const double gemm_rate = *std::max_element(gemm_samples.begin(), gemm_samples.end());
  std::printf("machine GEMM rate: %.1f GFLOP/s, the best of %zu GEMM runs (own and OpenBLAS, "
              "%s faster at start; median of all runs %.1f)\n\n",
              gemm_rate, gemm_samples.size(), own_wins ? "own sgemm" : "OpenBLAS",
              Median(gemm_samples));
  std::printf("%-8s %4s %4s %4s  %12s %12s  %9s %9s\n", "dtype", "Hq", "Hkv", "D",
              "fwd GFLOP/s", "bwd GFLOP/s", "fwd/gemm", "bwd/gemm");
  double last_fwd = 0, last_bwd = 0;
  for (const Row& r : rows) {
    std::printf("%-8s %4d %4d %4d  %12.1f %12.1f  %9.3f %9.3f\n",
                std::string(DTypeName(r.dtype)).c_str(), kHeads, kHeads, r.head_dim, r.fwd,
                r.bwd, r.fwd / gemm_rate, r.bwd / gemm_rate);
    if (r.dtype == DType::kFloat32 && r.head_dim == 128) {
      last_fwd = r.fwd / gemm_rate;
      last_bwd = r.bwd / gemm_rate;
    }
  }
  std::printf("load average at the end: %s\n", LoadAverage().c_str());
  std::printf("fwd_vs_gemm=%.3f bwd_vs_gemm=%.3f\n", last_fwd, last_bwd);
  return 0;
}

}  // namespace
}  // namespace hsap::bench

int main(int argc, char** argv) { return hsap::bench::Main(argc, argv); }
#endif  // HWY_ONCE

// The CUDA attention kernels' own source (forward_kernel.cuh,
// backward_kernel.cuh) run on the CPU through kernels/cuda/emulation.h, on
// the launch plans the real entry points build (launch_plan.h), against the
// float64 reference with kernel_test's yardsticks. Runs in CI (no GPU).
//
// Also the element-wise kernels (util_kernels.cuh): delta, merge, cast,
// pack / unpack / unpack-add.
//
// What it covers: the kernels' control flow, tile and block walks, shared
// memory layout and offsets, masks, online softmax, -inf handling, the LSE
// merge and waves, GQA, the dS split, atomics' targets, every head dim and
// dtype. What it cannot: real memory-model races and cp.async timing (the
// emulated copies are synchronous), and any misreading of the PTX fragment
// tables shared by the kernels and the emulator.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/backward_kernel.cuh"
#include "kernels/cuda/emulation.h"
#include "kernels/cuda/forward_kernel.cuh"
#include "kernels/cuda/launch_plan.h"
#include "kernels/cuda/util_kernels.cuh"
#include "tests/gpu/case_util.h"
#include "tests/gpu/run_case.h"

namespace hsap {
namespace {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
namespace kern = kernels::cuda::kernel;
namespace emu = kernels::cuda::emu;
using cpu::testing::RandomCase;
using cpu::testing::TypedBuffer;
using gpu_test::ExpectClose;
using gpu_test::ItemSlices;
using gpu_test::kFp32Tolerance;
using gpu_test::Record;
using gpu_test::ToGpu;
using gpu_test::WorstRatios;

// RunCase (run_case.h) calls the kernels' API, which
// //kernels/cuda:attention_emulated implements through the emulation.
using gpu_test::RunCase;

TEST(KernelEmulationTest, RandomCasesMatchFloat64Reference) {
  std::mt19937_64 rng(20261130);
  const int cases = 18;
  for (int n = 0; n < cases; ++n) {
    RandomCase c = cpu::testing::DrawCase(&rng, {DType::kBFloat16, DType::kFloat16}, 24);
    static const int kDims[] = {64, 128, 256};
    const int D = kDims[n % 3];
    const float peaky = c.shape.softmax_scale * std::sqrt(static_cast<float>(c.shape.head_dim));
    c.shape.head_dim = D;
    c.shape.softmax_scale = peaky / std::sqrt(static_cast<float>(D));
    SCOPED_TRACE(c.Describe());
    RunCase(c, /*split_keys=*/n % 4 == 3, &rng);
    if (HasFatalFailure()) return;
  }
}

// Q and K blocks past the first, interior blocks (no mask), windows, GQA.
TEST(KernelEmulationTest, PackedDocumentsWithInteriorBlocks) {
  std::mt19937_64 rng(5);
  RandomCase c;
  c.shape = {2, 1, 64, DType::kBFloat16, 0.125f};
  c.num_q = c.num_k = 300;
  c.slices = LowerDocuments({0, 37, 290, 300}, /*causal=*/true, /*window=*/-1);
  RunCase(c, false, &rng);
  c.shape.dtype = DType::kFloat16;
  c.slices = LowerDocuments({0, 300}, /*causal=*/true, /*window=*/90);
  RunCase(c, true, &rng);
  c.shape = {1, 1, 128, DType::kBFloat16, 1.f / std::sqrt(128.f)};
  c.num_q = c.num_k = 200;
  c.slices = LowerDocuments({0, 200}, /*causal=*/false, /*window=*/-1);
  RunCase(c, false, &rng);
  // Two 128-row m-tiles per warp, GQA 3:1, a window, several K blocks.
  c.shape = {3, 1, 128, DType::kFloat16, 1.f / std::sqrt(128.f)};
  c.num_q = c.num_k = 290;
  c.slices = LowerDocuments({0, 5, 290}, /*causal=*/true, /*window=*/150);
  RunCase(c, false, &rng);
  // D = 256: 64-row Q blocks, 32-key K blocks, one Q/dO buffer, 16 warps.
  c.shape = {2, 2, 256, DType::kBFloat16, 1.f / 16.f};
  c.num_q = c.num_k = 150;
  c.slices = LowerDocuments({0, 70, 150}, /*causal=*/true, /*window=*/-1);
  RunCase(c, true, &rng);
}

// The element-wise kernels, launched as attention_util.cu launches them.
TEST(KernelEmulationTest, DeltaMergeAndCastMatchTheCpu) {
  std::mt19937_64 rng(9);
  const int H = 3, D = 64;
  const int64_t T = 45;
  const cpu::AttentionShape shape{H, H, D, DType::kBFloat16, 0.125f};
  TypedBuffer o(shape.dtype, T * H * D), dout(shape.dtype, T * H * D);
  o.FillRandom(&rng, 1.f);
  dout.FillRandom(&rng, 1.f);
  std::vector<float> delta(H * T, 7.f);
  const int64_t warps = T * H;
  emu::Launch(kern::GridFor(warps * 32), 1, kern::kThreads, [&] {
    kern::DeltaKernel(o.data(), dout.data(), shape.dtype, T, H, D, delta.data(), T);
  });
  std::vector<float> want(H * T);
  cpu::ComputeDelta(shape, o.data(), dout.data(), T, want.data(), T, nullptr);
  EXPECT_LE(cpu::MaxRelativeError(std::vector<double>(delta.begin(), delta.end()),
                                  std::vector<double>(want.begin(), want.end())),
            1e-6);

  const int64_t rows = 37;
  std::vector<float> o_a(rows * H * D), o_b(rows * H * D), lse_a(H * rows), lse_b(H * rows);
  std::uniform_real_distribution<float> u(-3, 3);
  for (auto& x : o_a) x = u(rng);
  for (auto& x : o_b) x = u(rng);
  for (size_t i = 0; i < lse_a.size(); ++i) {
    lse_a[i] = i % 5 == 0 ? -INFINITY : u(rng);
    lse_b[i] = i % 7 == 0 ? -INFINITY : u(rng);
    if (std::isinf(lse_a[i])) {
      for (int d = 0; d < D; ++d) o_a[((i % rows) * H + i / rows) * D + d] = 0.f;
    }
  }
  std::vector<float> gpu_o = o_a, gpu_lse = lse_a;
  emu::Launch(kern::GridFor(rows * H), 1, kern::kThreads, [&] {
    kern::MergeKernel(H, D, rows, gpu_o.data(), gpu_lse.data(), o_b.data(), lse_b.data(), rows);
  });
  cpu::MergePartial(H, D, rows, o_a.data(), lse_a.data(), o_b.data(), lse_b.data(), rows);
  EXPECT_LE(cpu::MaxRelativeError(std::vector<double>(gpu_o.begin(), gpu_o.end()),
                                  std::vector<double>(o_a.begin(), o_a.end())),
            1e-6);
  EXPECT_LE(cpu::MaxRelativeError(std::vector<double>(gpu_lse.begin(), gpu_lse.end()),
                                  std::vector<double>(lse_a.begin(), lse_a.end())),
            1e-6);

  // Casts round to nearest even exactly as common/dtype.h, inf and tiny included.
  std::vector<float> src = {1.f, -2.5f, 3.14159f, 65504.f, 70000.f, 1e-8f, -1e-30f, INFINITY,
                            -INFINITY, 0.f, -0.f, 1.00390625f, 1.01171875f};
  for (int i = 0; i < 300; ++i) src.push_back(std::uniform_real_distribution<float>(-1e4, 1e4)(rng));
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    TypedBuffer got(dtype, src.size()), want_cast(dtype, src.size());
    emu::Launch(kern::GridFor(src.size()), 1, kern::kThreads, [&] {
      kern::CastKernel(src.data(), src.size(), dtype, got.data());
    });
    for (size_t i = 0; i < src.size(); ++i) StoreFromFloat(want_cast.data(), dtype, i, src[i]);
    EXPECT_EQ(std::memcmp(got.data(), want_cast.data(), src.size() * DTypeSize(dtype)), 0)
        << DTypeName(dtype);
  }
}

template <typename Word, bool kToPacked>
void EmulatePack(const std::vector<kern::PackedRange>& ranges, int64_t total_rows,
                 int64_t row_bytes, const void* src, void* dst) {
  const int64_t words = row_bytes / static_cast<int64_t>(sizeof(Word));
  emu::Launch(kern::GridFor(total_rows * words), 1, kern::kThreads, [&] {
    kern::PackKernel<Word, kToPacked>(ranges.data(), static_cast<int>(ranges.size()), total_rows,
                                      words, static_cast<const Word*>(src),
                                      static_cast<Word*>(dst));
  });
}

TEST(KernelEmulationTest, PackUnpackRoundTrips) {
  std::mt19937_64 rng(11);
  for (int n = 0; n < 12; ++n) {
    static const int64_t kRowBytes[] = {2 * 8 * 16, 12, 6};
    const int64_t row_bytes = kRowBytes[n % 3];
    const int64_t tokens = std::uniform_int_distribution<int64_t>(1, 120)(rng);
    std::vector<uint8_t> src(tokens * row_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<gpu::TokenRange> ranges;
    for (int64_t t = 0; t < tokens;) {
      const int64_t len = std::uniform_int_distribution<int64_t>(0, 30)(rng);
      if (rng() % 2) ranges.push_back({t, std::min(tokens, t + len)});
      t += len + 1;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    std::vector<kern::PackedRange> packed_ranges;
    int64_t total_rows = 0;
    ASSERT_TRUE(kern::BuildPackedRanges(ranges, &packed_ranges, &total_rows).ok());
    std::vector<uint8_t> want;
    for (const auto& r : ranges) {
      want.insert(want.end(), src.begin() + r.begin * row_bytes, src.begin() + r.end * row_bytes);
    }
    ASSERT_EQ(static_cast<int64_t>(want.size()), total_rows * row_bytes);
    std::vector<uint8_t> packed(want.size()), back(src.size(), 0), want_back(src.size(), 0);
    for (const auto& r : ranges) {
      std::copy(src.begin() + r.begin * row_bytes, src.begin() + r.end * row_bytes,
                want_back.begin() + r.begin * row_bytes);
    }
    if (total_rows == 0) continue;
    // The copy unit attention_util.cu would choose for these (aligned) buffers.
    if (row_bytes % 16 == 0) {
      EmulatePack<uint4, true>(packed_ranges, total_rows, row_bytes, src.data(), packed.data());
      EmulatePack<uint4, false>(packed_ranges, total_rows, row_bytes, packed.data(), back.data());
    } else if (row_bytes % 4 == 0) {
      EmulatePack<uint32_t, true>(packed_ranges, total_rows, row_bytes, src.data(), packed.data());
      EmulatePack<uint32_t, false>(packed_ranges, total_rows, row_bytes, packed.data(),
                                   back.data());
    } else {
      EmulatePack<uint8_t, true>(packed_ranges, total_rows, row_bytes, src.data(), packed.data());
      EmulatePack<uint8_t, false>(packed_ranges, total_rows, row_bytes, packed.data(),
                                  back.data());
    }
    EXPECT_EQ(packed, want) << "pack, row_bytes " << row_bytes;
    EXPECT_EQ(back, want_back) << "unpack, row_bytes " << row_bytes;
  }
  // UnpackAdd with overlapping ranges.
  const int64_t row_elems = 16;
  const std::vector<gpu::TokenRange> ranges = {{3, 10}, {5, 12}, {0, 2}, {5, 6}};
  std::vector<kern::PackedRange> packed_ranges;
  int64_t total_rows = 0;
  ASSERT_TRUE(kern::BuildPackedRanges(ranges, &packed_ranges, &total_rows).ok());
  std::vector<float> packed(total_rows * row_elems), dst(12 * row_elems);
  for (auto& x : packed) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (auto& x : dst) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<double> want(dst.begin(), dst.end());
  int64_t p = 0;
  for (const auto& r : ranges) {
    for (int64_t t = r.begin; t < r.end; ++t, ++p) {
      for (int64_t e = 0; e < row_elems; ++e) want[t * row_elems + e] += packed[p * row_elems + e];
    }
  }
  emu::Launch(kern::GridFor(total_rows * row_elems), 1, kern::kThreads, [&] {
    kern::UnpackAddKernel(packed_ranges.data(), static_cast<int>(packed_ranges.size()),
                          total_rows, row_elems, packed.data(), dst.data());
  });
  EXPECT_LE(cpu::MaxRelativeError(std::vector<double>(dst.begin(), dst.end()), want), 1e-6);
}

const ::testing::Environment* const kSummary =
    ::testing::AddGlobalTestEnvironment(new gpu_test::SummaryPrinter("EMULATION_SUMMARY"));

}  // namespace
}  // namespace hsap

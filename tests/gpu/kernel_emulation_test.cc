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

template <typename T, int D>
void EmulateForward(const gpu::AttentionShape& s, const std::vector<gpu::FwdWorkItem>& items) {
  static_assert(kern::FwdTraits<D>::kSmemBytes <= emu::kSharedBytes);
  gpu::internal::ForwardPlan plan;
  ASSERT_TRUE(gpu::internal::PlanForward(s, items, kern::FwdTraits<D>::kBlockQ, &plan).ok());
  for (size_t w = 0; w + 1 < plan.wave_begin.size(); ++w) {
    kern::FwdParams p;
    p.items = plan.items.data();
    p.tiles = plan.tiles.data() + plan.wave_begin[w];
    p.num_heads_q = s.num_heads_q;
    p.group = s.num_heads_q / s.num_heads_kv;
    p.scale_log2 = s.softmax_scale * 1.4426950408889634f;
    const int tiles = static_cast<int>(plan.wave_begin[w + 1] - plan.wave_begin[w]);
    emu::Launch(tiles, s.num_heads_q, kern::kFwdThreads, [&] { kern::ForwardKernel<T, D>(p); });
  }
}

template <typename T, int D>
void EmulateBackward(const gpu::AttentionShape& s, const std::vector<gpu::BwdWorkItem>& items) {
  static_assert(kern::BwdTraits<D>::kSmemBytes <= emu::kSharedBytes);
  gpu::internal::BackwardPlan plan;
  ASSERT_TRUE(gpu::internal::PlanBackward(s, items, kern::kBwdBlockK, &plan).ok());
  kern::BwdParams p;
  p.items = plan.items.data();
  p.tiles = plan.tiles.data();
  p.num_heads_q = s.num_heads_q;
  p.num_heads_kv = s.num_heads_kv;
  p.group = s.num_heads_q / s.num_heads_kv;
  p.scale = s.softmax_scale;
  p.scale_log2 = s.softmax_scale * 1.4426950408889634f;
  emu::Launch(static_cast<int>(plan.tiles.size()), s.num_heads_q, kern::BwdTraits<D>::kThreads,
              [&] { kern::BackwardKernel<T, D>(p); });
}

template <typename T>
void Dispatch(const gpu::AttentionShape& s, const std::vector<gpu::FwdWorkItem>* fwd,
              const std::vector<gpu::BwdWorkItem>* bwd) {
  switch (s.head_dim) {
    case 64: fwd ? EmulateForward<T, 64>(s, *fwd) : EmulateBackward<T, 64>(s, *bwd); break;
    case 128: fwd ? EmulateForward<T, 128>(s, *fwd) : EmulateBackward<T, 128>(s, *bwd); break;
    default: fwd ? EmulateForward<T, 256>(s, *fwd) : EmulateBackward<T, 256>(s, *bwd); break;
  }
}

void Run(const gpu::AttentionShape& s, const std::vector<gpu::FwdWorkItem>* fwd,
         const std::vector<gpu::BwdWorkItem>* bwd) {
  if (s.dtype == DType::kBFloat16) {
    Dispatch<__nv_bfloat16>(s, fwd, bwd);
  } else {
    Dispatch<__half>(s, fwd, bwd);
  }
}

std::vector<double> Rounded(const std::vector<float>& v, DType dtype) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = RoundThrough(dtype, v[i]);
  return out;
}

// kernel_test.cc's RunCase, with host memory and emulated launches.
void RunCase(const RandomCase& c, bool split_keys, std::mt19937_64* rng) {
  const cpu::AttentionShape& s = c.shape;
  const gpu::AttentionShape gs = ToGpu(s);
  const int Hq = s.num_heads_q, Hkv = s.num_heads_kv, D = s.head_dim;
  const int64_t q_elems = c.num_q * Hq * D, kv_elems = c.num_k * Hkv * D;
  TypedBuffer q(s.dtype, q_elems), k(s.dtype, kv_elems), v(s.dtype, kv_elems),
      dout(s.dtype, q_elems);
  q.FillRandom(rng, 1.f);
  k.FillRandom(rng, 1.f);
  v.FillRandom(rng, 1.f);
  dout.FillRandom(rng, 1.f);
  const size_t esz = DTypeSize(s.dtype);
  std::vector<float> o_acc(q_elems, 0.f), lse(Hq * c.num_q, -INFINITY);
  const std::vector<MaskSlice> slices = ItemSlices(c, split_keys);
  auto at = [&](const TypedBuffer& b, int64_t row, int heads) {
    return static_cast<const uint8_t*>(b.data()) + row * heads * D * esz;
  };
  std::vector<gpu::FwdWorkItem> fwd;
  for (const MaskSlice& m : slices) {
    gpu::FwdWorkItem it;
    it.q = at(q, m.q_begin, Hq);
    it.k = at(k, m.k_begin, Hkv);
    it.v = at(v, m.k_begin, Hkv);
    it.num_q = m.num_q();
    it.num_k = m.num_k();
    it.type = m.type;
    it.offset = m.offset;
    it.window = m.window;
    it.o_acc = o_acc.data() + m.q_begin * Hq * D;
    it.lse_acc = lse.data() + m.q_begin;
    it.lse_stride = c.num_q;
    fwd.push_back(it);
  }
  Run(gs, &fwd, nullptr);
  if (::testing::Test::HasFatalFailure()) return;

  std::vector<double> ref_o, ref_lse;
  cpu::ReferenceForward(s, q.data(), k.data(), v.data(), c.num_q, c.num_k, c.slices, &ref_o,
                        &ref_lse);
  const std::vector<double> got_o = Rounded(o_acc, s.dtype);
  const std::string key = std::string(DTypeName(s.dtype)) + " D=" + std::to_string(D);
  Record("fwd " + key, ExpectClose(got_o, ref_o, s.dtype, "O", c));
  EXPECT_LE(cpu::MaxRelativeError(std::vector<double>(lse.begin(), lse.end()), ref_lse),
            kFp32Tolerance)
      << "LSE of " << c.Describe();
  for (int h = 0; h < Hq; ++h) {
    for (int64_t i = 0; i < c.num_q; ++i) {
      if (!std::isinf(ref_lse[h * c.num_q + i])) continue;
      ASSERT_EQ(lse[h * c.num_q + i], -INFINITY) << "row " << i << " " << c.Describe();
      for (int d = 0; d < D; ++d) ASSERT_EQ(got_o[(i * Hq + h) * D + d], 0.0) << c.Describe();
    }
  }

  // Backward from O rounded to the dtype; Delta = rowsum(dO * O) in fp32.
  TypedBuffer o_typed(s.dtype, q_elems);
  for (int64_t i = 0; i < q_elems; ++i) StoreFromFloat(o_typed.data(), s.dtype, i, o_acc[i]);
  std::vector<float> delta(Hq * c.num_q, 0.f);
  for (int64_t t = 0; t < c.num_q; ++t) {
    for (int h = 0; h < Hq; ++h) {
      float sum = 0.f;
      for (int d = 0; d < D; ++d) {
        const int64_t i = (t * Hq + h) * D + d;
        sum += LoadAsFloat(o_typed.data(), s.dtype, i) * LoadAsFloat(dout.data(), s.dtype, i);
      }
      delta[h * c.num_q + t] = sum;
    }
  }
  std::vector<float> dq(q_elems, 0.f), dk(kv_elems, 0.f), dv(kv_elems, 0.f);
  std::vector<gpu::BwdWorkItem> bwd;
  for (size_t i = 0; i < slices.size(); ++i) {
    const MaskSlice& m = slices[i];
    gpu::BwdWorkItem it;
    it.q = fwd[i].q;
    it.k = fwd[i].k;
    it.v = fwd[i].v;
    it.dout = at(dout, m.q_begin, Hq);
    it.lse = lse.data() + m.q_begin;
    it.delta = delta.data() + m.q_begin;
    it.lse_stride = c.num_q;
    it.num_q = m.num_q();
    it.num_k = m.num_k();
    it.type = m.type;
    it.offset = m.offset;
    it.window = m.window;
    it.dq_acc = dq.data() + m.q_begin * Hq * D;
    it.dk_acc = dk.data() + m.k_begin * Hkv * D;
    it.dv_acc = dv.data() + m.k_begin * Hkv * D;
    bwd.push_back(it);
  }
  Run(gs, nullptr, &bwd);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<double> got_dq = Rounded(dq, s.dtype), got_dk = Rounded(dk, s.dtype),
                            got_dv = Rounded(dv, s.dtype);
  std::vector<double> ref_dq, ref_dk, ref_dv;
  cpu::ReferenceBackward(s, q.data(), k.data(), v.data(), dout.data(), c.num_q, c.num_k,
                         c.slices, &ref_dq, &ref_dk, &ref_dv);
  double max_dv = 0;
  for (double x : ref_dv) max_dv = std::max(max_dv, std::fabs(x));
  ExpectClose(got_dq, ref_dq, s.dtype, "dQ (exact O)", c, 4.0, max_dv);
  ExpectClose(got_dk, ref_dk, s.dtype, "dK (exact O)", c, 4.0, max_dv);
  cpu::ReferenceBackwardFromOutput(s, q.data(), k.data(), v.data(), o_typed.data(), dout.data(),
                                   c.num_q, c.num_k, c.slices, &ref_dq, &ref_dk, &ref_dv);
  double e = ExpectClose(got_dq, ref_dq, s.dtype, "dQ", c, 2.0, max_dv);
  e = std::max(e, ExpectClose(got_dk, ref_dk, s.dtype, "dK", c, 2.0, max_dv));
  e = std::max(e, ExpectClose(got_dv, ref_dv, s.dtype, "dV", c));
  Record("bwd " + key, e);
}

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

TEST(KernelEmulationTest, ZzPrintSummary) {
  for (const auto& [key, ratio] : WorstRatios()) {
    std::printf("EMULATION_SUMMARY %s worst_error_over_rounding=%.3f tolerance=2\n", key.c_str(),
                ratio);
  }
}

}  // namespace
}  // namespace hsap

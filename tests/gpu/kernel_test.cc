// The CUDA attention kernels (kernels/cuda/attention.h) against the float64
// reference (kernels/cpu/reference.h) on a GPU. Tagged "gpu".
//
// Yardsticks (as kernels/cpu/attention_test.cc): bf16/fp16 outputs, rounded
// to the storage dtype, must be within 2x the error of "the float64 result
// rounded to the dtype" (floor 1e-5); dQ/dK/dV against
// ReferenceBackwardFromOutput on the same rounded O (2x) and against the
// exact-O reference (4x); LSE (fp32) within 1e-5 relative; rows that see no
// key exactly O = 0 and LSE = -inf. Plus Pack/Unpack/UnpackAdd round trips,
// MergePartial against the CPU merge, and ComputeDelta.
//
// Each run prints "KERNEL_TEST_SUMMARY ..." lines with the worst error /
// yardstick ratios; tests/gpu/device_check.sh puts them in its table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/attention.h"
#include "tests/gpu/case_util.h"
#include "tests/gpu/device_buffer.h"
#include "tests/gpu/run_case.h"

namespace hsap {
namespace {

namespace cpu = kernels::cpu;
namespace gpu = kernels::cuda;
using cpu::testing::RandomCase;
using cpu::testing::TypedBuffer;
using gpu_test::DeviceBuffer;
using gpu_test::ExpectClose;
using gpu_test::ItemSlices;
using gpu_test::kFp32Tolerance;
using gpu_test::Record;
using gpu_test::ToGpu;
using gpu_test::WorstRatios;

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

using gpu_test::RunCase;

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = gpu_test::NoGpuReason();
    ASSERT_TRUE(why.empty()) << "this test needs a GPU: " << why;
    ASSERT_TRUE(gpu::BuiltWithCuda()) << "kernels/cuda was built without CUDA";
  }
};

TEST_F(KernelTest, RandomCasesMatchFloat64Reference) {
  std::mt19937_64 rng(20261130);
  constexpr int kCases = 240;
  for (int n = 0; n < kCases; ++n) {
    RandomCase c = cpu::testing::DrawCase(&rng, {DType::kBFloat16, DType::kFloat16}, 200);
    // The CUDA kernels' head dims; keep DrawCase's peaky-softmax factor.
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

// Many Q and K blocks, interior and edge blocks, GQA, every D and dtype.
TEST_F(KernelTest, LongerPackedDocumentsMatchReference) {
  std::mt19937_64 rng(7);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int D : {64, 128, 256}) {
      RandomCase c;
      c.shape = {4, 2, D, dtype, 1.f / std::sqrt(static_cast<float>(D))};
      c.num_q = c.num_k = 700;
      c.slices = LowerDocuments({0, 37, 300, 301, 700}, /*causal=*/true, /*window=*/-1);
      RunCase(c, false, &rng);
      c.slices = LowerDocuments({0, 450, 700}, /*causal=*/true, /*window=*/130);
      RunCase(c, true, &rng);
      c.slices = LowerDocuments({0, 200, 700}, /*causal=*/false, /*window=*/-1);
      RunCase(c, false, &rng);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(KernelTest, PackUnpackRoundTrips) {
  std::mt19937_64 rng(11);
  for (int n = 0; n < 50; ++n) {
    // Row sizes that take the 16-byte, 4-byte and 1-byte copy paths.
    static const int64_t kRowBytes[] = {2 * 8 * 128, 12, 6};
    const int64_t row_bytes = kRowBytes[n % 3];
    const int64_t tokens = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    std::vector<uint8_t> src(tokens * row_bytes);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    // Disjoint ranges in random order (what a send list looks like).
    std::vector<gpu::TokenRange> ranges;
    for (int64_t t = 0; t < tokens;) {
      const int64_t len = std::uniform_int_distribution<int64_t>(0, 40)(rng);
      if (rng() % 2) ranges.push_back({t, std::min(tokens, t + len)});
      t += len + 1;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    std::vector<uint8_t> want;
    for (const auto& r : ranges) {
      want.insert(want.end(), src.begin() + r.begin * row_bytes, src.begin() + r.end * row_bytes);
    }
    DeviceBuffer d_src = DeviceBuffer::FromVector(src);
    DeviceBuffer packed(want.size());
    ASSERT_TRUE(gpu::Pack(d_src.get(), row_bytes, ranges, packed.get(), nullptr).ok());
    EXPECT_EQ(packed.ToHost<uint8_t>(), want) << "pack, row_bytes " << row_bytes;
    std::vector<uint8_t> zeros(src.size(), 0), back = zeros;
    for (const auto& r : ranges) {
      std::copy(src.begin() + r.begin * row_bytes, src.begin() + r.end * row_bytes,
                back.begin() + r.begin * row_bytes);
    }
    DeviceBuffer d_back = DeviceBuffer::FromVector(zeros);
    ASSERT_TRUE(gpu::Unpack(packed.get(), row_bytes, ranges, d_back.get(), nullptr).ok());
    EXPECT_EQ(d_back.ToHost<uint8_t>(), back) << "unpack, row_bytes " << row_bytes;
  }
  // UnpackAdd: overlapping ranges add up (dK/dV partials returned to owners).
  const int64_t row_elems = 2 * 64;
  const std::vector<gpu::TokenRange> ranges = {{3, 10}, {5, 12}, {0, 2}, {5, 6}};
  int64_t packed_rows = 0;
  for (const auto& r : ranges) packed_rows += r.end - r.begin;
  std::vector<float> packed(packed_rows * row_elems), dst(12 * row_elems);
  for (auto& x : packed) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (auto& x : dst) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  std::vector<double> want(dst.begin(), dst.end());
  int64_t p = 0;
  for (const auto& r : ranges) {
    for (int64_t t = r.begin; t < r.end; ++t, ++p) {
      for (int64_t e = 0; e < row_elems; ++e) want[t * row_elems + e] += packed[p * row_elems + e];
    }
  }
  DeviceBuffer d_packed = DeviceBuffer::FromVector(packed), d_dst = DeviceBuffer::FromVector(dst);
  ASSERT_TRUE(gpu::UnpackAdd(d_packed.as<float>(), row_elems, ranges, d_dst.as<float>(), nullptr)
                  .ok());
  EXPECT_LE(cpu::MaxRelativeError(ToDouble(d_dst.ToHost<float>()), want), 1e-6);
}

TEST_F(KernelTest, MergePartialMatchesCpuMerge) {
  std::mt19937_64 rng(13);
  const int H = 3, D = 64;
  const int64_t rows = 77;
  std::vector<float> o_a(rows * H * D), o_b(rows * H * D), lse_a(H * rows), lse_b(H * rows);
  std::uniform_real_distribution<float> u(-3, 3);
  for (auto& x : o_a) x = u(rng);
  for (auto& x : o_b) x = u(rng);
  for (size_t i = 0; i < lse_a.size(); ++i) {
    lse_a[i] = i % 5 == 0 ? -INFINITY : u(rng);  // -inf on one side, both sides, neither
    lse_b[i] = i % 7 == 0 ? -INFINITY : u(rng);
    if (std::isinf(lse_a[i])) {
      for (int d = 0; d < D; ++d) o_a[((i % rows) * H + i / rows) * D + d] = 0.f;
    }
  }
  DeviceBuffer d_oa = DeviceBuffer::FromVector(o_a), d_la = DeviceBuffer::FromVector(lse_a);
  DeviceBuffer d_ob = DeviceBuffer::FromVector(o_b), d_lb = DeviceBuffer::FromVector(lse_b);
  ASSERT_TRUE(gpu::MergePartial(H, D, rows, d_oa.as<float>(), d_la.as<float>(), d_ob.as<float>(),
                                d_lb.as<float>(), rows, nullptr)
                  .ok());
  cpu::MergePartial(H, D, rows, o_a.data(), lse_a.data(), o_b.data(), lse_b.data(), rows);
  EXPECT_LE(cpu::MaxRelativeError(ToDouble(d_oa.ToHost<float>()), ToDouble(o_a)), 1e-6);
  EXPECT_LE(cpu::MaxRelativeError(ToDouble(d_la.ToHost<float>()), ToDouble(lse_a)), 1e-6);
}

// Runs last (gtest runs tests in order of definition): the summary lines.
const ::testing::Environment* const kSummary =
    ::testing::AddGlobalTestEnvironment(new gpu_test::SummaryPrinter("KERNEL_TEST_SUMMARY"));

}  // namespace
}  // namespace hsap

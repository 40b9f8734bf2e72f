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

std::vector<double> DeviceTyped(const DeviceBuffer& acc, int64_t n, DType dtype) {
  if (n == 0) return {};
  DeviceBuffer typed(n * DTypeSize(dtype));
  EXPECT_TRUE(gpu::CastFromFloat(acc.as<float>(), n, dtype, typed.get(), nullptr).ok());
  TypedBuffer host(dtype, n);
  gpu_test::CudaOrDie(cudaMemcpy(host.data(), typed.get(), typed.bytes(), cudaMemcpyDeviceToHost),
                      "download");
  return host.ToDouble();
}

// Forward and backward of one case on the GPU against the reference.
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
  DeviceBuffer dq_in = DeviceBuffer::From(q.data(), q_elems * esz);
  DeviceBuffer dk_in = DeviceBuffer::From(k.data(), kv_elems * esz);
  DeviceBuffer dv_in = DeviceBuffer::From(v.data(), kv_elems * esz);
  DeviceBuffer ddo = DeviceBuffer::From(dout.data(), q_elems * esz);
  DeviceBuffer o_acc = DeviceBuffer::FromVector(std::vector<float>(q_elems, 0.f));
  DeviceBuffer lse_acc =
      DeviceBuffer::FromVector(std::vector<float>(Hq * c.num_q, -INFINITY));

  const std::vector<MaskSlice> slices = ItemSlices(c, split_keys);
  std::vector<gpu::FwdWorkItem> fwd;
  for (const MaskSlice& m : slices) {
    gpu::FwdWorkItem it;
    it.q = dq_in.as<uint8_t>() + m.q_begin * Hq * D * esz;
    it.k = dk_in.as<uint8_t>() + m.k_begin * Hkv * D * esz;
    it.v = dv_in.as<uint8_t>() + m.k_begin * Hkv * D * esz;
    it.num_q = m.num_q();
    it.num_k = m.num_k();
    it.type = m.type;
    it.offset = m.offset;
    it.window = m.window;
    it.o_acc = o_acc.as<float>() + m.q_begin * Hq * D;
    it.lse_acc = lse_acc.as<float>() + m.q_begin;
    it.lse_stride = c.num_q;
    fwd.push_back(it);
  }
  const absl::Status fwd_status = gpu::Forward(gs, fwd, nullptr);
  ASSERT_TRUE(fwd_status.ok()) << fwd_status;
  gpu_test::CudaOrDie(cudaDeviceSynchronize(), "forward");

  std::vector<double> ref_o, ref_lse;
  cpu::ReferenceForward(s, q.data(), k.data(), v.data(), c.num_q, c.num_k, c.slices, &ref_o,
                        &ref_lse);
  const std::vector<double> got_o = DeviceTyped(o_acc, q_elems, s.dtype);
  const std::vector<float> lse = lse_acc.ToHost<float>();
  const std::string key = std::string(DTypeName(s.dtype)) + " D=" + std::to_string(D);
  Record("fwd " + key, ExpectClose(got_o, ref_o, s.dtype, "O", c));
  EXPECT_LE(cpu::MaxRelativeError(ToDouble(lse), ref_lse), kFp32Tolerance) << "LSE of "
                                                                           << c.Describe();
  for (int h = 0; h < Hq; ++h) {
    for (int64_t i = 0; i < c.num_q; ++i) {
      if (!std::isinf(ref_lse[h * c.num_q + i])) continue;
      ASSERT_EQ(lse[h * c.num_q + i], -INFINITY) << "row " << i << " " << c.Describe();
      for (int d = 0; d < D; ++d) {
        ASSERT_EQ(got_o[(i * Hq + h) * D + d], 0.0) << c.Describe();
      }
    }
  }

  // Backward from O rounded to the dtype, as a trainer passes it.
  TypedBuffer o_typed(s.dtype, q_elems);
  for (int64_t i = 0; i < q_elems; ++i) StoreFromFloat(o_typed.data(), s.dtype, i, got_o[i]);
  DeviceBuffer d_o = DeviceBuffer::From(o_typed.data(), q_elems * esz);
  DeviceBuffer delta(Hq * c.num_q * sizeof(float));
  ASSERT_TRUE(gpu::ComputeDelta(gs, d_o.get(), ddo.get(), c.num_q, delta.as<float>(), c.num_q,
                                nullptr)
                  .ok());
  DeviceBuffer dq_acc = DeviceBuffer::FromVector(std::vector<float>(q_elems, 0.f));
  DeviceBuffer dk_acc = DeviceBuffer::FromVector(std::vector<float>(kv_elems, 0.f));
  DeviceBuffer dv_acc = DeviceBuffer::FromVector(std::vector<float>(kv_elems, 0.f));
  std::vector<gpu::BwdWorkItem> bwd;
  for (size_t i = 0; i < slices.size(); ++i) {
    const MaskSlice& m = slices[i];
    gpu::BwdWorkItem it;
    it.q = fwd[i].q;
    it.k = fwd[i].k;
    it.v = fwd[i].v;
    it.dout = ddo.as<uint8_t>() + m.q_begin * Hq * D * esz;
    it.lse = lse_acc.as<float>() + m.q_begin;
    it.delta = delta.as<float>() + m.q_begin;
    it.lse_stride = c.num_q;
    it.num_q = m.num_q();
    it.num_k = m.num_k();
    it.type = m.type;
    it.offset = m.offset;
    it.window = m.window;
    it.dq_acc = dq_acc.as<float>() + m.q_begin * Hq * D;
    it.dk_acc = dk_acc.as<float>() + m.k_begin * Hkv * D;
    it.dv_acc = dv_acc.as<float>() + m.k_begin * Hkv * D;
    bwd.push_back(it);
  }
  const absl::Status bwd_status = gpu::Backward(gs, bwd, nullptr);
  ASSERT_TRUE(bwd_status.ok()) << bwd_status;
  gpu_test::CudaOrDie(cudaDeviceSynchronize(), "backward");
  const std::vector<double> got_dq = DeviceTyped(dq_acc, q_elems, s.dtype);
  const std::vector<double> got_dk = DeviceTyped(dk_acc, kv_elems, s.dtype);
  const std::vector<double> got_dv = DeviceTyped(dv_acc, kv_elems, s.dtype);

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
TEST_F(KernelTest, ZzPrintSummary) {
  for (const auto& [key, ratio] : WorstRatios()) {
    std::printf("KERNEL_TEST_SUMMARY %s worst_error_over_rounding=%.3f tolerance=2\n",
                key.c_str(), ratio);
  }
}

}  // namespace
}  // namespace hsap

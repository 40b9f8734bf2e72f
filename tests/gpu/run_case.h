// One random case through the CUDA kernels' API (kernels/cuda/attention.h)
// against the float64 reference, shared by the GPU test (real kernels) and
// its CPU emulation (//kernels/cuda:attention_emulated): device memory from
// DeviceAllocate, host copies through CopyRows, so the same code runs on
// both. Yardsticks as kernel_test.cc's header says.
#ifndef HSAP_TESTS_GPU_RUN_CASE_H_
#define HSAP_TESTS_GPU_RUN_CASE_H_

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/attention.h"
#include "tests/gpu/case_util.h"

namespace hsap::gpu_test {

// Device memory through the kernels' API, with host copies.
class ApiBuffer {
 public:
  explicit ApiBuffer(int64_t bytes) : bytes_(bytes) {
    EXPECT_TRUE(kernels::cuda::DeviceAllocate(bytes, &data_).ok());
  }
  ApiBuffer(const void* host, int64_t bytes) : ApiBuffer(bytes) { Upload(host); }
  ApiBuffer(const ApiBuffer&) = delete;
  ApiBuffer& operator=(const ApiBuffer&) = delete;
  ~ApiBuffer() { kernels::cuda::DeviceFree(data_); }

  void Upload(const void* host) { Copy(host, data_); }
  void Download(void* host) const { Copy(data_, host); }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  void Copy(const void* src, void* dst) const {
    if (bytes_ == 0) return;
    const kernels::RowCopy c{src, dst, 1, 0, 0, bytes_};
    EXPECT_TRUE(kernels::cuda::CopyRows({&c, 1}, nullptr).ok());
    EXPECT_TRUE(kernels::cuda::StreamSynchronize(nullptr).ok());
  }
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// fp32 accumulators cast to the dtype on the device, read back widened.
inline std::vector<double> DeviceTyped(const ApiBuffer& acc, int64_t n, DType dtype) {
  if (n == 0) return {};
  ApiBuffer typed(n * DTypeSize(dtype));
  EXPECT_TRUE(kernels::cuda::CastFromFloat(acc.as<float>(), n, dtype, typed.as<void>(), nullptr)
                  .ok());
  kernels::cpu::testing::TypedBuffer host(dtype, n);
  typed.Download(host.data());
  return host.ToDouble();
}

// Forward and backward of one case against the reference; records the worst
// error / yardstick ratios (WorstRatios).
inline void RunCase(const kernels::cpu::testing::RandomCase& c, bool split_keys,
                    std::mt19937_64* rng) {
  namespace cpu = kernels::cpu;
  namespace gpu = kernels::cuda;
  const cpu::AttentionShape& s = c.shape;
  const int Hq = s.num_heads_q, Hkv = s.num_heads_kv, D = s.head_dim;
  const int64_t q_elems = c.num_q * Hq * D, kv_elems = c.num_k * Hkv * D;
  cpu::testing::TypedBuffer q(s.dtype, q_elems), k(s.dtype, kv_elems), v(s.dtype, kv_elems),
      dout(s.dtype, q_elems);
  q.FillRandom(rng, 1.f);
  k.FillRandom(rng, 1.f);
  v.FillRandom(rng, 1.f);
  dout.FillRandom(rng, 1.f);
  const int64_t esz = DTypeSize(s.dtype);
  ApiBuffer dq_in(q.data(), q_elems * esz), dk_in(k.data(), kv_elems * esz),
      dv_in(v.data(), kv_elems * esz), ddo(dout.data(), q_elems * esz);
  const std::vector<float> zeros_q(q_elems, 0.f), zeros_kv(kv_elems, 0.f),
      neg_inf(Hq * c.num_q, -INFINITY);
  ApiBuffer o_acc(zeros_q.data(), q_elems * 4), lse_acc(neg_inf.data(), Hq * c.num_q * 4);

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
  const absl::Status fwd_status = gpu::Forward(s, fwd, nullptr);
  ASSERT_TRUE(fwd_status.ok()) << fwd_status;
  ASSERT_TRUE(gpu::StreamSynchronize(nullptr).ok());

  std::vector<double> ref_o, ref_lse;
  cpu::ReferenceForward(s, q.data(), k.data(), v.data(), c.num_q, c.num_k, c.slices, &ref_o,
                        &ref_lse);
  const std::vector<double> got_o = DeviceTyped(o_acc, q_elems, s.dtype);
  std::vector<float> lse(Hq * c.num_q);
  lse_acc.Download(lse.data());
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

  // Backward from O rounded to the dtype, as a trainer passes it.
  cpu::testing::TypedBuffer o_typed(s.dtype, q_elems);
  for (int64_t i = 0; i < q_elems; ++i) StoreFromFloat(o_typed.data(), s.dtype, i, got_o[i]);
  ApiBuffer d_o(o_typed.data(), q_elems * esz), delta(Hq * c.num_q * 4);
  ASSERT_TRUE(gpu::ComputeDelta(s, d_o.as<void>(), ddo.as<void>(), c.num_q, delta.as<float>(),
                                c.num_q, nullptr)
                  .ok());
  ApiBuffer dq_acc(zeros_q.data(), q_elems * 4), dk_acc(zeros_kv.data(), kv_elems * 4),
      dv_acc(zeros_kv.data(), kv_elems * 4);
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
  const absl::Status bwd_status = gpu::Backward(s, bwd, nullptr);
  ASSERT_TRUE(bwd_status.ok()) << bwd_status;
  ASSERT_TRUE(gpu::StreamSynchronize(nullptr).ok());
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

}  // namespace hsap::gpu_test

#endif  // HSAP_TESTS_GPU_RUN_CASE_H_

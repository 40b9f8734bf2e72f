#include "server/exec/paced_backend.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/exec/cpu_backend.h"

namespace hsap::exec {
namespace {

constexpr int kTokens = 128, kHeads = 2, kDim = 32;

// One causal head-pair slice of kTokens over random fp32 inputs.
struct Inputs {
  std::vector<float> q, k, v, dout, o, lse, delta;
  Inputs() : q(kTokens * kHeads * kDim), k(q.size()), v(q.size()), dout(q.size()) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* t : {&q, &k, &v, &dout}) {
      for (float& x : *t) x = u(rng);
    }
  }
};

kernels::AttentionShape Shape() {
  kernels::AttentionShape s;
  s.num_heads_q = kHeads;
  s.num_heads_kv = kHeads;
  s.head_dim = kDim;
  s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  return s;
}

// The cost model's forward FLOPs of the slice: 4 * causal area * Hq * D.
double SliceFlops() { return 4.0 * (kTokens * (kTokens + 1) / 2) * kHeads * kDim; }

struct Outputs {
  std::vector<float> o = std::vector<float>(kTokens * kHeads * kDim, 0.f);
  std::vector<float> lse =
      std::vector<float>(kHeads * kTokens, -std::numeric_limits<float>::infinity());
};

absl::Status RunForward(ComputeBackend* b, const Inputs& in, Outputs* out,
                        const StopCheck* stop = nullptr) {
  kernels::FwdWorkItem w;
  w.q = in.q.data();
  w.k = in.k.data();
  w.v = in.v.data();
  w.num_q = w.num_k = kTokens;
  w.type = MaskType::kCausal;
  w.o_acc = out->o.data();
  w.lse_acc = out->lse.data();
  w.lse_stride = kTokens;
  return b->Forward(Shape(), {&w, 1}, stop);
}

TEST(PacedBackend, ForwardTakesAtLeastTheModelsTimeAndGivesTheSameBits) {
  Inputs in;
  CpuBackend plain(1);
  Outputs want;
  ASSERT_TRUE(RunForward(&plain, in, &want).ok());

  const double rate = SliceFlops() / 0.2;  // 200 ms of paced work
  PacedBackend paced(std::make_unique<CpuBackend>(1), rate);
  Outputs got;
  const absl::Time start = absl::Now();
  ASSERT_TRUE(RunForward(&paced, in, &got).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(std::memcmp(got.o.data(), want.o.data(), got.o.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(got.lse.data(), want.lse.data(), got.lse.size() * sizeof(float)), 0);
}

TEST(PacedBackend, BackwardIsChargedTwoAndAHalfForwards) {
  Inputs in;
  Outputs fwd;
  CpuBackend plain(1);
  ASSERT_TRUE(RunForward(&plain, in, &fwd).ok());
  std::vector<float> delta(kHeads * kTokens);
  ASSERT_TRUE(plain.ComputeDelta(Shape(), fwd.o.data(), in.dout.data(), kTokens, delta.data(),
                                 kTokens)
                  .ok());
  std::vector<float> dq(in.q.size()), dk(in.q.size()), dv(in.q.size());
  kernels::BwdWorkItem w;
  w.q = in.q.data();
  w.k = in.k.data();
  w.v = in.v.data();
  w.dout = in.dout.data();
  w.lse = fwd.lse.data();
  w.delta = delta.data();
  w.lse_stride = kTokens;
  w.num_q = w.num_k = kTokens;
  w.type = MaskType::kCausal;
  w.dq_acc = dq.data();
  w.dk_acc = dk.data();
  w.dv_acc = dv.data();
  // 80 ms per forward FLOP count: backward must take 2.5 x 80 = 200 ms.
  PacedBackend paced(std::make_unique<CpuBackend>(1), SliceFlops() / 0.08);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(paced.Backward(Shape(), {&w, 1}).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_NE(dq[0], 0.f);
}

TEST(PacedBackend, WaitDrivesTransfersAndHonoursTheDeadline) {
  Inputs in;
  PacedBackend paced(std::make_unique<CpuBackend>(1), SliceFlops() / 30.0);  // 30 s paced
  std::atomic<int> waves{0};
  StopCheck stop;
  stop.deadline = absl::Now() + absl::Milliseconds(100);
  stop.between_waves = [&] { waves.fetch_add(1); };
  Outputs out;
  const absl::Time start = absl::Now();
  const absl::Status s = RunForward(&paced, in, &out, &stop);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  EXPECT_GT(waves.load(), 1);  // the kernel's own waves and the pacing loop's
}

TEST(PacedBackend, WaitEndsWhenTheCallerCancels) {
  Inputs in;
  PacedBackend paced(std::make_unique<CpuBackend>(1), SliceFlops() / 30.0);
  const absl::Time cancel_at = absl::Now() + absl::Milliseconds(100);
  StopCheck stop;
  stop.cancelled = [&] { return absl::Now() >= cancel_at; };
  Outputs out;
  const absl::Time start = absl::Now();
  const absl::Status s = RunForward(&paced, in, &out, &stop);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

}  // namespace
}  // namespace hsap::exec

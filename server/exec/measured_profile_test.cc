#include "server/exec/measured_profile.h"

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/exec/device_slots.h"
#include "server/plan/cost_model.h"

namespace hsap::exec {
namespace {

TEST(RoundToThreeDigits, KeepsThreeSignificantDigits) {
  using plan::RoundToThreeDigits;
  EXPECT_DOUBLE_EQ(RoundToThreeDigits(5479690000.0), 5480000000.0);
  EXPECT_DOUBLE_EQ(RoundToThreeDigits(604005.0), 604000.0);
  EXPECT_DOUBLE_EQ(RoundToThreeDigits(2.2749e-5), 2.27e-5);
  EXPECT_DOUBLE_EQ(RoundToThreeDigits(0.0), 0.0);
  EXPECT_DOUBLE_EQ(RoundToThreeDigits(999.6), 1000.0);
  // Exactly the double a profile string's "0.953" parses to, so the string
  // prints three digits (round(x / 1e-3) * 1e-3 gave 0.9530000000000001).
  EXPECT_EQ(RoundToThreeDigits(0.95301), 0.953);
  plan::HardwareProfile p = plan::GetHardwareProfile("h100");
  p.kv_interleave_factor = RoundToThreeDigits(0.95301);
  p.attention_flops = RoundToThreeDigits(3.6049e10);
  const std::string s = plan::CustomProfileString(p);
  EXPECT_NE(s.find("kv_interleave_factor=0.953"), std::string::npos) << s;
  EXPECT_EQ(s.find("0.9530"), std::string::npos) << s;
  EXPECT_NE(s.find("flops=3.6e+10,"), std::string::npos) << s;
}

TEST(MeasuredProfiles, MeasuresOncePerDtypeAndHeadDimAndCaches) {
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(2, 1);
  MeasuredProfiles m(slots.get());
  EXPECT_TRUE(m.Measured().empty());
  auto a = m.Compute(DType::kFloat32, 64);
  ASSERT_TRUE(a.ok()) << a.status();
  std::printf("forward %.3g FLOP/s, backward / forward %.3g\n", a->forward_flops,
              a->backward_factor);
  // A CPU core runs attention at 0.1 to 1000 GFLOP/s; backward costs more
  // than forward (forward and backward timed in alternating pairs, so that
  // other processes taking the cores slow both alike).
  EXPECT_GT(a->forward_flops, 1e8);
  EXPECT_LT(a->forward_flops, 1e12);
  EXPECT_GT(a->backward_factor, 1.0);
  // Backward is 2.5x the forward's FLOPs; far more means the run fell on the
  // exact float64 tiles (inputs not finite) or timed noise.
  EXPECT_LT(a->backward_factor, 8.0);
  auto again = m.Compute(DType::kFloat32, 64);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->forward_flops, a->forward_flops);  // cached, not measured again
  auto bf16 = m.Compute(DType::kBFloat16, 64);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->dtype, DType::kBFloat16);
  ASSERT_EQ(m.Measured().size(), 2u);
}

TEST(MeasuredProfiles, ConcurrentCallersShareOneMeasurement) {
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(1, 1);
  MeasuredProfiles m(slots.get());
  std::vector<double> rates(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { rates[i] = m.Compute(DType::kFloat32, 32)->forward_flops; });
  }
  for (std::thread& t : threads) t.join();
  for (double r : rates) EXPECT_EQ(r, rates[0]);
  EXPECT_EQ(m.Measured().size(), 1u);
}

TEST(MeasuredProfiles, BeyondTheCapTheNearestHeadDimServes) {
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(1, 1);
  MeasuredProfiles m(slots.get());
  for (int d = 1; d <= MeasuredProfiles::kMaxEntries; ++d) {
    ASSERT_TRUE(m.Compute(DType::kFloat16, 8 * d).ok()) << d;
  }
  ASSERT_EQ(m.Measured().size(), static_cast<size_t>(MeasuredProfiles::kMaxEntries));
  auto far = m.Compute(DType::kFloat16, 4000);
  ASSERT_TRUE(far.ok());
  EXPECT_EQ(far->head_dim, 8 * MeasuredProfiles::kMaxEntries);  // the nearest measured
  EXPECT_EQ(m.Measured().size(), static_cast<size_t>(MeasuredProfiles::kMaxEntries));
}

TEST(MeasuredProfiles, TheLocalProfileIsAParametricProfileOfTheMeasurements) {
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(2, 1);
  MeasuredProfiles m(slots.get());
  EXPECT_FALSE(m.intra_measured());
  auto s = m.LocalProfile(DType::kFloat32, 64);
  ASSERT_TRUE(s.ok()) << s.status();
  auto p = plan::ParseHardwareProfile(*s);
  ASSERT_TRUE(p.ok()) << *s << ": " << p.status();
  const ComputeRate rate = *m.Compute(DType::kFloat32, 64);
  EXPECT_DOUBLE_EQ(p->attention_flops, rate.forward_flops);
  EXPECT_DOUBLE_EQ(p->backward_factor, rate.backward_factor);
  EXPECT_DOUBLE_EQ(p->kv_interleave_factor, rate.kv_interleave_factor);
  EXPECT_GE(rate.kv_interleave_factor, 0.5);
  EXPECT_LE(rate.kv_interleave_factor, 1.0);
  ASSERT_TRUE(m.intra_measured());
  const IntraTier intra = m.Intra();
  // A memory copy moves more than 100 MB/s; handing a message to a thread
  // takes under 10 ms (even under a sanitizer).
  EXPECT_GT(intra.bytes_per_s, 1e8);
  EXPECT_GT(intra.latency_s, 0);
  EXPECT_LT(intra.latency_s, 1e-2);
  EXPECT_DOUBLE_EQ(p->intra_bytes_per_s, intra.bytes_per_s);
  EXPECT_DOUBLE_EQ(p->inter_bytes_per_s, intra.bytes_per_s);
  // The same string every time: it is part of the plan key.
  EXPECT_EQ(*m.LocalProfile(DType::kFloat32, 64), *s);
}

TEST(MeasuredProfiles, TheCallersDeadlineAndCancellationStopTheMeasurement) {
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(2, 1);
  MeasuredProfiles m(slots.get());
  StopCheck expired;
  expired.deadline = absl::Now() - absl::Seconds(1);
  EXPECT_EQ(m.Compute(DType::kFloat32, 64, &expired).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  StopCheck cancelled;
  cancelled.cancelled = [] { return true; };
  EXPECT_EQ(m.LocalProfile(DType::kFloat32, 64, &cancelled).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_TRUE(m.Measured().empty());  // a stopped measurement is not kept
  ASSERT_TRUE(m.Compute(DType::kFloat32, 64).ok());  // the next caller measures
  EXPECT_EQ(m.Measured().size(), 1u);
}

TEST(MeasuredProfiles, AWaiterLeavesAtItsDeadlineWhileAnotherMeasures) {
  // Paced slots (2e7 FLOP/s: a 32 MFLOP forward takes 1.6 s), so the first
  // caller's measurement runs until its 3 s deadline ends it.
  std::unique_ptr<DeviceSlots> slots = DeviceSlots::Cpu(1, 1, nullptr, 2e7);
  MeasuredProfiles m(slots.get());
  absl::Status first, second;
  absl::Time first_end, second_end;
  std::thread measuring([&] {
    StopCheck stop;
    stop.deadline = absl::Now() + absl::Seconds(3);
    first = m.Compute(DType::kFloat32, 32, &stop).status();
    first_end = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  StopCheck stop;
  stop.deadline = absl::Now() + absl::Milliseconds(100);
  second = m.Compute(DType::kFloat32, 32, &stop).status();
  second_end = absl::Now();
  measuring.join();
  EXPECT_EQ(first.code(), absl::StatusCode::kDeadlineExceeded) << first;
  EXPECT_EQ(second.code(), absl::StatusCode::kDeadlineExceeded) << second;
  EXPECT_LT(second_end, first_end);  // it did not wait for the measurement to end
  EXPECT_TRUE(m.Measured().empty());
}

}  // namespace
}  // namespace hsap::exec

// The tiles' exp2 on every SIMD target the CPU runs, against std::exp2 in
// double: the relative error bound kernels/cpu/README.md states (2e-7: the
// AVX-512 degree-5 polynomial measures 1.7e-7, the degree-6 one of the
// other targets below 8e-8), and the exact values the softmax relies on:
// exp2(0) = 1, exp2(-inf) = 0 (masked scores), and 0 far below the range.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/cpu/tile_kernels.h"

namespace hsap::kernels::cpu::internal {
namespace {

class Exp2Test : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { hwy::SetSupportedTargetsForTest(GetParam()); }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

TEST_P(Exp2Test, RelativeErrorOverTheNormalRange) {
  // 2^20 points over [-126, 126): every part of the reduced argument's
  // range [-1/2, 1/2] many times over.
  constexpr int64_t kN = int64_t{1} << 20;
  std::vector<float> x(kN), y(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>(-126.0 + 252.0 * i / kN);
  Exp2ForTest(x.data(), kN, y.data());
  double worst = 0;
  float worst_x = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const double ref = std::exp2(static_cast<double>(x[i]));
    const double rel = std::fabs(static_cast<double>(y[i]) - ref) / ref;
    if (rel > worst) {
      worst = rel;
      worst_x = x[i];
    }
  }
  EXPECT_LT(worst, 2e-7) << SimdTargetName() << " at x = " << worst_x;
  std::printf("%s: max relative error %.3g (x = %.6f)\n", SimdTargetName(), worst, worst_x);
}

TEST_P(Exp2Test, ExactValuesTheSoftmaxReliesOn) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(16, 0.f), y(16, -1.f);
  x[1] = -inf;
  x[2] = -200.f;
  x[3] = -151.f;
  x[4] = 1.f;
  x[5] = -1.f;
  x[6] = 10.f;
  Exp2ForTest(x.data(), 16, y.data());
  EXPECT_EQ(y[0], 1.f) << SimdTargetName();
  EXPECT_EQ(y[1], 0.f) << SimdTargetName();
  EXPECT_EQ(y[2], 0.f) << SimdTargetName();
  EXPECT_EQ(y[3], 0.f) << SimdTargetName();
  // Integers: the polynomial at f = 0 is exactly 1, so 2^n is exact.
  EXPECT_EQ(y[4], 2.f) << SimdTargetName();
  EXPECT_EQ(y[5], 0.5f) << SimdTargetName();
  EXPECT_EQ(y[6], 1024.f) << SimdTargetName();
}

// The targets the kernels were compiled for (tile_kernels.cc disables some
// that this file's Highway would still list) and the CPU runs.
std::vector<int64_t> Targets() {
  std::vector<int64_t> out;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    if (std::string(SimdTargetName()) == hwy::TargetName(t)) out.push_back(t);
  }
  hwy::SetSupportedTargetsForTest(0);
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, Exp2Test, ::testing::ValuesIn(Targets()),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return std::string(hwy::TargetName(info.param));
                         });

}  // namespace
}  // namespace hsap::kernels::cpu::internal

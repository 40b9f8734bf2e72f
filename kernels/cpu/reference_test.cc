// The float64 reference itself, on cases small enough to work out by hand.
#include "kernels/cpu/reference.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace hsap::kernels::cpu {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Hq = Hkv = 1, D = 2 (below the kernels' range, fine for the reference).
AttentionShape TinyShape(float scale) { return {1, 1, 2, DType::kFloat32, scale}; }

TEST(ReferenceTest, CausalRowsAverageTheirVisibleValues) {
  // Zero queries: every visible key gets equal weight.
  const float q[] = {0, 0, 0, 0, 0, 0};
  const float k[] = {1, 2, 3, 4, 5, 6};
  const float v[] = {1, 10, 3, 30, 8, 80};
  const MaskSlice causal{0, 3, 0, 3, MaskType::kCausal, 0, -1};
  std::vector<double> o, lse;
  ReferenceForward(TinyShape(1.f), q, k, v, 3, 3, {&causal, 1}, &o, &lse);
  EXPECT_DOUBLE_EQ(o[0], 1);
  EXPECT_DOUBLE_EQ(o[1], 10);
  EXPECT_DOUBLE_EQ(o[2], 2);
  EXPECT_DOUBLE_EQ(o[3], 20);
  EXPECT_DOUBLE_EQ(o[4], 4);
  EXPECT_DOUBLE_EQ(o[5], 40);
  EXPECT_DOUBLE_EQ(lse[0], 0);
  EXPECT_DOUBLE_EQ(lse[1], std::log(2.0));
  EXPECT_DOUBLE_EQ(lse[2], std::log(3.0));
}

TEST(ReferenceTest, SoftmaxWeightsAndEmptyRows) {
  // Row 0 sees keys 0 and 1 with scores 0 and log 3 (scale 1): weights 1/4, 3/4.
  // Row 1 sees nothing (negative offset): O = 0, LSE = -inf.
  const float q[] = {1, 0, 5, 5};
  const float k[] = {0, 0, static_cast<float>(std::log(3.0)), 0};
  const float v[] = {4, 0, 0, 8};
  const MaskSlice full{0, 1, 0, 2, MaskType::kFull, 0, -1};
  const MaskSlice none{1, 2, 0, 2, MaskType::kCausal, -1, -1};
  const MaskSlice slices[] = {full, none};
  std::vector<double> o, lse;
  ReferenceForward(TinyShape(1.f), q, k, v, 2, 2, slices, &o, &lse);
  EXPECT_NEAR(o[0], 1, 1e-6);  // k[2] = log 3 rounded to float
  EXPECT_NEAR(o[1], 6, 1e-6);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-6);
  EXPECT_EQ(o[2], 0);
  EXPECT_EQ(o[3], 0);
  EXPECT_EQ(lse[1], -kInf);
}

TEST(ReferenceTest, OverlappingSlicesCountPairsOnce) {
  const float q[] = {0.3f, -0.2f, 0.1f, 0.7f};
  const float k[] = {0.5f, 0.1f, -0.4f, 0.9f};
  const float v[] = {1, 2, 3, 4};
  const MaskSlice full{0, 2, 0, 2, MaskType::kFull, 0, -1};
  const MaskSlice twice[] = {full, full};
  std::vector<double> o1, l1, o2, l2;
  ReferenceForward(TinyShape(0.7f), q, k, v, 2, 2, {&full, 1}, &o1, &l1);
  ReferenceForward(TinyShape(0.7f), q, k, v, 2, 2, twice, &o2, &l2);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
}

TEST(ReferenceTest, BackwardMatchesFiniteDifferences) {
  // Loss = sum(dO * O); compare dQ[0] with a central difference.
  const AttentionShape shape = TinyShape(0.9f);
  float q[] = {0.3f, -0.2f, 0.1f, 0.7f, -0.5f, 0.25f};
  const float k[] = {0.5f, 0.1f, -0.4f, 0.9f, 0.2f, -0.3f};
  const float v[] = {1, 2, 3, -4, 0.5f, 1.5f};
  const float dout[] = {0.2f, -1, 0.6f, 0.3f, -0.7f, 0.4f};
  const MaskSlice causal{0, 3, 0, 3, MaskType::kCausal, 0, -1};
  std::vector<double> dq, dk, dv;
  ReferenceBackward(shape, q, k, v, dout, 3, 3, {&causal, 1}, &dq, &dk, &dv);
  auto loss = [&] {
    std::vector<double> o, lse;
    ReferenceForward(shape, q, k, v, 3, 3, {&causal, 1}, &o, &lse);
    double l = 0;
    for (int i = 0; i < 6; ++i) l += o[i] * dout[i];
    return l;
  };
  for (int idx : {2, 3, 4, 5}) {
    const float saved = q[idx];
    const float h = 1.f / 64;  // exact in float, so 2h is the true step
    q[idx] = saved + h;
    const double up = loss();
    q[idx] = saved - h;
    const double down = loss();
    q[idx] = saved;
    const double numeric = (up - down) / (2.0 * h);
    EXPECT_NEAR(dq[idx], numeric, 2e-4) << "dq[" << idx << "]";
  }
  // Row 0 sees only key 0: P = 1, so dQ[0] = 0; key 2 is seen by row 2 only.
  EXPECT_NEAR(dq[0], 0, 1e-12);
  EXPECT_NEAR(dq[1], 0, 1e-12);
  EXPECT_NE(dv[4], 0);
}

TEST(ReferenceTest, MaxRelativeError) {
  EXPECT_DOUBLE_EQ(MaxRelativeError({1.0, 2.5}, {1.0, 2.0}), 0.25);
  EXPECT_EQ(MaxRelativeError({-kInf, 1.0}, {-kInf, 1.0}), 0.0);
  EXPECT_EQ(MaxRelativeError({0.0, 1.0}, {-kInf, 1.0}), kInf);
  EXPECT_EQ(MaxRelativeError({std::nan(""), 1.0}, {0.0, 1.0}), kInf);
  EXPECT_EQ(MaxRelativeError({1.0}, {1.0, 2.0}), kInf);
}

}  // namespace
}  // namespace hsap::kernels::cpu

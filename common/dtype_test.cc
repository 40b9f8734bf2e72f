#include "common/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace hsap {
namespace {

// Round-to-nearest-even reference through double arithmetic.
double RoundToGrid(double v, int mantissa_bits, int min_exp, double max_finite) {
  if (std::isnan(v) || std::isinf(v)) return v;
  if (v == 0) return v;
  int e;
  std::frexp(std::fabs(v), &e);  // |v| = m * 2^e, m in [0.5, 1)
  int exp = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, exp - mantissa_bits);
  const double q = std::nearbyint(v / ulp) * ulp;  // default rounding: to nearest even
  if (std::fabs(q) > max_finite) return std::copysign(INFINITY, v);
  return q;
}

TEST(DTypeTest, Fp16MatchesNearestEven) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    // Cover subnormals, normals and overflow: exponents from 2^-30 to 2^17.
    const double mag = std::ldexp(1.0 + (state >> 8) / double(1 << 24), int(state % 48) - 30);
    const float f = static_cast<float>((state & 1) ? -mag : mag);
    const double expect = RoundToGrid(f, 10, -14, 65504.0);
    EXPECT_EQ(static_cast<double>(Fp16ToFloat(FloatToFp16(f))), expect) << "input " << f;
  }
}

TEST(DTypeTest, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f))));
      continue;
    }
    EXPECT_EQ(FloatToFp16(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, Bf16MatchesNearestEven) {
  uint32_t state = 777;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float f = BitsFloat(state & 0xbfffffffu);  // avoid most inf/nan exponents
    if (!std::isfinite(f)) continue;
    const double expect = RoundToGrid(f, 7, -126, 3.3895313892515355e38);
    EXPECT_EQ(static_cast<double>(Bf16ToFloat(FloatToBf16(f))), expect) << "input " << f;
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, ParseNames) {
  DType t;
  ASSERT_TRUE(ParseDType("bf16", &t));
  EXPECT_EQ(t, DType::kBFloat16);
  ASSERT_TRUE(ParseDType("float16", &t));
  EXPECT_EQ(t, DType::kFloat16);
  EXPECT_FALSE(ParseDType("int8", &t));
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
}

}  // namespace
}  // namespace hsap

#include "common/dtype.h"

namespace hsap {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
  }
  return "unknown";
}

bool ParseDType(absl::string_view name, DType* out) {
  if (name == "float32" || name == "fp32") { *out = DType::kFloat32; return true; }
  if (name == "bfloat16" || name == "bf16") { *out = DType::kBFloat16; return true; }
  if (name == "float16" || name == "fp16") { *out = DType::kFloat16; return true; }
  return false;
}

uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value = m * 2^-24, round to nearest even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 -> 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t drop = 126 - exp;  // value = mant * 2^(exp-150) = half * 2^-24
    uint32_t half = mant >> drop;
    const uint32_t rem = mant & ((1u << drop) - 1);
    const uint32_t halfway = 1u << (drop - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias exponent (127 -> 15) and round 23 -> 10 mantissa bits.
  uint32_t v = abs - 0x38000000u;  // exponent - 112
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsFloat(sign);
    // Subnormal: normalise.
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return BitsFloat(sign | (static_cast<uint32_t>(112 - e) << 23) | (mant << 13));
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace hsap

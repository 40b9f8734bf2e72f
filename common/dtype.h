// Element types of the tensors HSAP moves and computes on, and scalar
// conversions between them and float.
//
// Storage is fp32, bf16 or fp16; all arithmetic accumulates in fp32 (DESIGN.md
// §4). The scalar conversions here are exact (round to nearest even) and are
// the definition that SIMD kernels must reproduce bit for bit.
#ifndef HSAP_COMMON_DTYPE_H_
#define HSAP_COMMON_DTYPE_H_

#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

#if defined(__CUDACC__)
#define HSAP_HOST_DEVICE __host__ __device__
#else
#define HSAP_HOST_DEVICE
#endif

namespace hsap {

enum class DType : uint8_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

// Bytes of one element.
HSAP_HOST_DEVICE constexpr int DTypeSize(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

// "float32", "bfloat16" or "float16".
absl::string_view DTypeName(DType t);

// Parses "float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16".
// Returns false for anything else.
bool ParseDType(absl::string_view name, DType* out);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 <-> float. NaN stays NaN (quiet); rounding is to nearest even.
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// IEEE half <-> float, round to nearest even, with subnormals, inf and NaN.
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

// Reads element `i` of a buffer of type `t` as float.
inline float LoadAsFloat(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kBFloat16: return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16: return Fp16ToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.f;
}

// Writes `v`, rounded to type `t`, as element `i`.
inline void StoreFromFloat(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = FloatToBf16(v); return;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = FloatToFp16(v); return;
  }
}

// Rounds `v` through type `t` and back (identity for fp32).
inline float RoundThrough(DType t, float v) {
  switch (t) {
    case DType::kFloat32: return v;
    case DType::kBFloat16: return Bf16ToFloat(FloatToBf16(v));
    case DType::kFloat16: return Fp16ToFloat(FloatToFp16(v));
  }
  return v;
}

}  // namespace hsap

#endif  // HSAP_COMMON_DTYPE_H_

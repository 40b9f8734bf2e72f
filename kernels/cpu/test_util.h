// Test helpers for the CPU attention kernels: typed tensors with random
// contents and random mask layouts. Test-only (//kernels/cpu:test_util).
#ifndef HSAP_KERNELS_CPU_TEST_UTIL_H_
#define HSAP_KERNELS_CPU_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/mask.h"
#include "kernels/cpu/attention.h"

namespace hsap::kernels::cpu::testing {

// A tensor stored as `dtype`, n elements.
class TypedBuffer {
 public:
  TypedBuffer(DType dtype, int64_t n) : dtype_(dtype), bytes_(n * DTypeSize(dtype)), n_(n) {}
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  int64_t size() const { return n_; }
  DType dtype() const { return dtype_; }
  // Fills with uniform values in [-amplitude, amplitude], rounded to dtype.
  void FillRandom(std::mt19937_64* rng, float amplitude);
  std::vector<double> ToDouble() const;

 private:
  DType dtype_;
  std::vector<uint8_t> bytes_;
  int64_t n_;
};

// `values` rounded through `dtype` (what storing a float64 result costs).
std::vector<double> RoundedThrough(const std::vector<double>& values, DType dtype);

// One random attention problem: shape, sizes and a slice list whose query
// ranges do not overlap (the executor's contract), so every allowed pair is
// computed once.
struct RandomCase {
  AttentionShape shape;
  int64_t num_q = 0;
  int64_t num_k = 0;
  std::vector<MaskSlice> slices;
  std::string Describe() const;
};

// Draws shapes (D multiple of 8 in 32..256 and a few others), GQA ratios,
// dtypes from `dtypes`, and masks: packed causal/bidirectional documents
// (with windows), single slices with negative, zero, positive and
// bottom-right offsets, several slices over disjoint query ranges with
// arbitrary key ranges, empty slices and rows that see no key.
RandomCase DrawCase(std::mt19937_64* rng, const std::vector<DType>& dtypes, int64_t max_tokens);

}  // namespace hsap::kernels::cpu::testing

#endif  // HSAP_KERNELS_CPU_TEST_UTIL_H_

// Shared by the GPU kernel test and its CPU emulation (test-only): the
// yardstick check of kernels/cpu/attention_test.cc, work items from random
// cases, and the worst-ratio summary.
#ifndef HSAP_TESTS_GPU_CASE_UTIL_H_
#define HSAP_TESTS_GPU_CASE_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/test_util.h"
#include "kernels/cuda/attention.h"

namespace hsap::gpu_test {

using kernels::cpu::testing::RandomCase;
using kernels::cpu::testing::RoundedThrough;

inline constexpr double kFp32Tolerance = 1e-5;

// Worst error / yardstick per (kind, dtype, D), for the summary line.
inline std::map<std::string, double>& WorstRatios() {
  static auto* worst = new std::map<std::string, double>;
  return *worst;
}

inline void Record(const std::string& key, double ratio) {
  double& w = WorstRatios()[key];
  w = std::max(w, ratio);
}

// Prints the worst ratios as "<tag> <key> worst_error_over_rounding=..."
// lines once every test has run (device_check.sh reads them); not a test:
// register it with ::testing::AddGlobalTestEnvironment.
class SummaryPrinter : public ::testing::Environment {
 public:
  explicit SummaryPrinter(const char* tag) : tag_(tag) {}
  void TearDown() override {
    for (const auto& [key, ratio] : WorstRatios()) {
      std::printf("%s %s worst_error_over_rounding=%.3f tolerance=2\n", tag_, key.c_str(), ratio);
    }
  }

 private:
  const char* tag_;
};

// As attention_test.cc: returns error / yardstick (0 when the expected
// values vanish and the actual ones are below the fp32 tolerance).
inline double ExpectClose(const std::vector<double>& actual, const std::vector<double>& expected,
                   DType dtype, const std::string& what, const RandomCase& c,
                   double rounding_factor = 2.0, double scale_if_zero = 1.0) {
  double max_expected = 0, max_actual = 0;
  for (double x : expected) max_expected = std::max(max_expected, std::fabs(x));
  for (double x : actual) max_actual = std::max(max_actual, std::fabs(x));
  if (max_expected == 0) {
    EXPECT_LE(max_actual, kFp32Tolerance * scale_if_zero) << what << " should vanish: "
                                                          << c.Describe();
    return 0;
  }
  const double err = kernels::cpu::MaxRelativeError(actual, expected);
  const double yardstick =
      std::max(kernels::cpu::MaxRelativeError(RoundedThrough(expected, dtype), expected),
               kFp32Tolerance);
  EXPECT_LE(err, rounding_factor * yardstick)
      << what << " of " << c.Describe() << " (rounding alone: " << yardstick << ")";
  return err / yardstick;
}

inline kernels::cuda::AttentionShape ToGpu(const kernels::cpu::AttentionShape& s) {
  return {s.num_heads_q, s.num_heads_kv, s.head_dim, s.dtype, s.softmax_scale};
}

// The slices of `c` as work items over whole-rank device buffers; with
// `split_keys`, every slice with more than one key becomes two items over
// the two halves of its key range (same query rows: their merge is tested).
inline std::vector<MaskSlice> ItemSlices(const RandomCase& c, bool split_keys) {
  std::vector<MaskSlice> out;
  for (const MaskSlice& s : c.slices) {
    if (!split_keys || s.num_k() < 2) {
      out.push_back(s);
      continue;
    }
    const int64_t half = s.num_k() / 2;
    MaskSlice a = s, b = s;
    a.k_end = s.k_begin + half;
    b.k_begin = s.k_begin + half;
    if (s.type == MaskType::kCausal) b.offset = s.offset - half;  // same diagonal
    out.push_back(a);
    out.push_back(b);
  }
  return out;
}

}  // namespace hsap::gpu_test

#endif  // HSAP_TESTS_GPU_CASE_UTIL_H_

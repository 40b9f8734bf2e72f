// Helpers shared by the fuzz targets of tests/fuzz/.
#ifndef HSAP_TESTS_FUZZ_FUZZ_UTIL_H_
#define HSAP_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// A property of the code under test failed: report and crash, so libFuzzer
// saves the input.
#define FUZZ_CHECK(cond)                                                           \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                \
    }                                                                              \
  } while (0)

namespace hsap::fuzz {

// Usually in [-2, small_max]; sometimes any int64, in [-big_max, big_max],
// or big_max itself (the edges validation must handle).
inline int64_t Value(FuzzedDataProvider& in, int64_t small_max, int64_t big_max) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return in.ConsumeIntegral<int64_t>();
    case 1: return in.ConsumeIntegralInRange<int64_t>(-big_max, big_max);
    case 2: return big_max;
    default: return in.ConsumeIntegralInRange<int64_t>(-2, small_max);
  }
}

// a + b saturated to the int64 range.
inline int64_t AddSat(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

}  // namespace hsap::fuzz

#endif  // HSAP_TESTS_FUZZ_FUZZ_UTIL_H_

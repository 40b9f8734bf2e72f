// How much of a long sweep a test runs under a sanitizer (docs/reliability.md,
// "Where tests run"). Sanitized code runs 5-30x slower, so command two could not
// run every sweep of random cases and configurations three times within CI's
// time. A sweep asks Keeps(i) of its i-th case: the plain build keeps every
// case; an ASan build keeps one case in `stride`, a TSan build one in
// 4 * stride, the same cases on every run, and both still draw the skipped
// cases' random inputs so that the cases they keep are exactly the plain
// build's. TSan keeps fewer: it checks how threads order their memory
// accesses, which a case's shapes change little (the same pool, the same
// waves, the same transports), and it ran these sweeps 10-25x slower than
// the plain build (numerics_test 145 s, executor_test 161 s on CI's run of
// 2026-12-06, the two longest tests of command two).
#ifndef HSAP_TESTS_SANITIZERS_SWEEP_H_
#define HSAP_TESTS_SANITIZERS_SWEEP_H_

#include <cstdint>

namespace hsap::sweep {

#if defined(__SANITIZE_THREAD__) || defined(THREAD_SANITIZER)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ADDRESS_SANITIZER) || \
    defined(__SANITIZE_THREAD__) || defined(THREAD_SANITIZER)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Every case in a plain build; cases 0, stride, 2 * stride, ... under ASan;
// cases 0, 4 * stride, ... under TSan.
constexpr bool Keeps(int64_t index, int64_t stride = 5) {
  const int64_t s = kThreadSanitizer ? 4 * stride : stride;
  return !kSanitized || index % s == 0;
}

// How many of cases 0 .. n-1 Keeps keeps (for a sweep that checks it ran
// the cases it meant to).
constexpr int64_t Kept(int64_t n, int64_t stride = 5) {
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) kept += Keeps(i, stride) ? 1 : 0;
  return kept;
}

}  // namespace hsap::sweep

#endif  // HSAP_TESTS_SANITIZERS_SWEEP_H_

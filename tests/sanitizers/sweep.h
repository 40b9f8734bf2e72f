// How much of a long sweep a test runs under a sanitizer (docs/reliability.md,
// "Where tests run"). Sanitized code runs 5-30x slower, so command two could not
// run every sweep of random cases and configurations three times within CI's
// time. A sweep asks Keeps(i) of its i-th case: the plain build keeps every
// case; a sanitized build keeps one case in `stride`, the same cases on
// every run, and still draws the skipped cases' random inputs so that the
// cases it keeps are exactly the plain build's.
#ifndef HSAP_TESTS_SANITIZERS_SWEEP_H_
#define HSAP_TESTS_SANITIZERS_SWEEP_H_

#include <cstdint>

namespace hsap::sweep {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    defined(ADDRESS_SANITIZER) || defined(THREAD_SANITIZER)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

// Every case in a plain build; cases 0, stride, 2 * stride, ... otherwise.
constexpr bool Keeps(int64_t index, int64_t stride = 5) {
  return !kSanitized || index % stride == 0;
}

}  // namespace hsap::sweep

#endif  // HSAP_TESTS_SANITIZERS_SWEEP_H_

// NaN/infinity checks shared by the numerics tests of every backend
// (tests/numerics:numerics_test, tests/gpu:numerics_emulation_test):
// poisoning one input element, and comparing which outputs are NaN or
// infinite with the float64 reference's (docs/numerics.md).
#ifndef HSAP_TESTS_NUMERICS_NONFINITE_PATTERNS_H_
#define HSAP_TESTS_NUMERICS_NONFINITE_PATTERNS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tests/numerics/group_harness.h"

namespace hsap::testing {

// One poisoned input: which tensor ("q", "k", "v", "dO") and the value.
struct Poison {
  const char* tensor;
  double value;
};

// Stores p.value at (row, head, dim) of the poisoned tensor of `problem`.
void Poisoned(GroupProblem* problem, const Poison& p, int64_t row, int head, int dim);

// The NaN pattern (and the pattern of infinities) of `got` equals `ref`'s as
// fp32 rounds it (gtest expectations naming `what`).
void ExpectSamePattern(const std::vector<double>& got, const std::vector<double>& ref,
                       const std::string& what);

// The non-finite set of `got` equals `ref`'s (a NaN where the other has an
// infinity is accepted).
void ExpectSameNonFiniteSet(const std::vector<double>& got, const std::vector<double>& ref,
                            const std::string& what);

}  // namespace hsap::testing

#endif  // HSAP_TESTS_NUMERICS_NONFINITE_PATTERNS_H_

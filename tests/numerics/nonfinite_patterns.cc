#include "tests/numerics/nonfinite_patterns.h"

#include <cmath>

#include "common/dtype.h"
#include "gtest/gtest.h"

namespace hsap::testing {

void Poisoned(GroupProblem* pr, const Poison& p, int64_t row, int head, int dim) {
  const std::string name = p.tensor;
  std::vector<char>* t = name == "q" ? &pr->q : name == "k" ? &pr->k : name == "v" ? &pr->v : &pr->d_o;
  const int heads = (t == &pr->k || t == &pr->v) ? pr->shape.num_heads_kv : pr->shape.num_heads_q;
  StoreFromFloat(t->data(), pr->shape.dtype, (row * heads + head) * pr->shape.head_dim + dim,
                 static_cast<float>(p.value));
}

void ExpectSamePattern(const std::vector<double>& got, const std::vector<double>& ref,
                       const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t nan_ref = 0, mismatched = 0;
  int64_t first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = static_cast<float>(ref[i]);  // as the fp32 output rounds it
    nan_ref += std::isnan(r);
    const bool same = std::isnan(r) ? std::isnan(got[i])
                      : std::isinf(r) ? got[i] == r
                                      : std::isfinite(got[i]);
    if (!same) {
      ++mismatched;
      if (first < 0) first = static_cast<int64_t>(i);
    }
  }
  EXPECT_EQ(mismatched, 0) << what << ": first at " << first << " (got "
                           << (first >= 0 ? got[first] : 0.0) << ", reference "
                           << (first >= 0 ? ref[first] : 0.0) << "); reference NaNs " << nan_ref;
}

void ExpectSameNonFiniteSet(const std::vector<double>& got, const std::vector<double>& ref,
                            const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t mismatched = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    mismatched += std::isfinite(got[i]) != std::isfinite(static_cast<float>(ref[i]));
  }
  EXPECT_EQ(mismatched, 0) << what;
}

}  // namespace hsap::testing

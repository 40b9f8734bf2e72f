#include "server/metrics/histogram.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/logging.h"

namespace hsap::metrics {
namespace {

BucketBoundaries WithoutTrailingInf(const BucketBoundaries& bounds) {
  BucketBoundaries out = bounds;
  if (!out.empty() && out.back() == std::numeric_limits<double>::infinity()) out.pop_back();
  return out;
}

}  // namespace

absl::Status Histogram::ValidateBounds(const BucketBoundaries& bounds) {
  const BucketBoundaries finite = WithoutTrailingInf(bounds);
  if (finite.empty()) {
    return absl::InvalidArgumentError("histogram needs at least one finite bucket bound");
  }
  for (size_t i = 0; i < finite.size(); ++i) {
    if (!std::isfinite(finite[i])) {
      return absl::InvalidArgumentError(
          absl::StrFormat("histogram bucket bound %d is %g: bounds must be finite", i, finite[i]));
    }
    if (i > 0 && !(finite[i] > finite[i - 1])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "histogram bucket bounds must increase strictly: bound %d is %g after %g", i, finite[i],
          finite[i - 1]));
    }
  }
  return absl::OkStatus();
}

Histogram::Histogram(const BucketBoundaries& bounds) : bounds_(WithoutTrailingInf(bounds)) {
  const absl::Status valid = ValidateBounds(bounds);
  HSAP_CHECK(valid.ok()) << valid;
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: the "le" bucket; past the end is +Inf.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  double current = sum_.load(std::memory_order_relaxed);
  while (!sum_.compare_exchange_weak(current, current + value, std::memory_order_relaxed)) {
  }
}

void Histogram::CollectInto(ClientMetric* out) const {
  out->buckets.clear();
  out->buckets.reserve(bounds_.size() + 1);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    const double bound =
        i < bounds_.size() ? bounds_[i] : std::numeric_limits<double>::infinity();
    out->buckets.push_back({.upper_bound = bound, .cumulative_count = cumulative});
  }
  out->sample_count = cumulative;
  out->sample_sum = sum_.load(std::memory_order_relaxed);
}

}  // namespace hsap::metrics

// A distribution of observations in fixed buckets (prometheus-cpp's
// Histogram).
//
// Bucket i counts observations <= bounds[i]; a last +Inf bucket counts all.
// Thread-safe and lock-free: Observe is a binary search and three atomic
// updates. Owned by its Family; every series of a family shares the
// family's bounds (set once, at registration), so that histogram_quantile()
// can aggregate across series.
//
// Example:
//   Family<Histogram>& f = BuildHistogram().Name("hsap_call_duration_seconds")
//       .Help("...").Buckets({0.001, 0.01, 0.1, 1}).Register(registry);
//   f.Add({{"op", "forward"}}).Observe(0.004);
#ifndef HSAP_SERVER_METRICS_HISTOGRAM_H_
#define HSAP_SERVER_METRICS_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "server/metrics/metric_family.h"

namespace hsap::metrics {

using BucketBoundaries = std::vector<double>;

class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;

  // OK when `bounds` is non-empty, finite and strictly increasing (a final
  // +Inf is allowed and dropped: the +Inf bucket is always there);
  // INVALID_ARGUMENT naming the offending bound otherwise.
  static absl::Status ValidateBounds(const BucketBoundaries& bounds);

  // REQUIRES: ValidateBounds(bounds).ok() (aborts otherwise).
  explicit Histogram(const BucketBoundaries& bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose bound is >= value and adds it
  // to the sum. NaN is ignored (it would make the sum NaN forever).
  void Observe(double value);

  // Upper bounds, finite, without the implicit +Inf.
  const BucketBoundaries& bounds() const { return bounds_; }

  // Fills buckets (cumulative, ending with +Inf), count and sum. The count
  // is the +Inf bucket's, so the two always agree within one snapshot.
  void CollectInto(ClientMetric* out) const;

 private:
  BucketBoundaries bounds_;
  // Non-cumulative counts; size bounds_.size() + 1 (the last is +Inf).
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_HISTOGRAM_H_

// A metric family: one name, help and type, and its series by label set
// (prometheus-cpp's Family<T>).
//
// Families are made by the builders of registry.h and owned by the Registry;
// callers hold references. Adding a series takes the family's mutex; using
// one (Increment, Set, Observe) is lock-free, so the hot path keeps the
// reference that Add returned instead of calling Add per event.
//
// Cardinality is bounded: a family holds at most `max_series` label sets.
// Beyond that, Add refuses new label sets: it returns the family's overflow
// series, which is never exported, and counts the refusal in
// hsap_metrics_dropped_series_total{family="<name>"}. The same happens to a
// label set that is invalid (bad label name, "le" on a histogram, a value
// that is not UTF-8): a metrics mistake must never take the daemon down.
// TryAdd reports either case as a status instead.
//
// Example:
//   Family<Counter>& calls = BuildCounter().Name("hsap_calls_total")
//       .Help("Attention calls.").Register(registry);
//   Counter& ok = calls.Add({{"op", "forward"}, {"status", "OK"}});
//   ok.Increment();
#ifndef HSAP_SERVER_METRICS_FAMILY_H_
#define HSAP_SERVER_METRICS_FAMILY_H_

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/metrics/counter.h"
#include "server/metrics/gauge.h"
#include "server/metrics/histogram.h"
#include "server/metrics/metric_family.h"
#include "server/metrics/names.h"

namespace hsap::metrics {

class Registry;

// What a builder hands the registry: everything that defines a family.
struct FamilySpec {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  BucketBoundaries buckets;  // histograms only
  size_t max_series = 1000;
};

// The type-erased part the registry stores and collects.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const FamilySpec& spec() const { return spec_; }

  // The family and its series sorted by labels. Thread-safe.
  virtual MetricFamily Collect() const = 0;

 protected:
  explicit FamilyBase(FamilySpec spec) : spec_(std::move(spec)) {}

  const FamilySpec spec_;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  static_assert(std::is_same_v<T, Counter> || std::is_same_v<T, Gauge> ||
                    std::is_same_v<T, Histogram>,
                "Family<T> holds Counter, Gauge or Histogram");

  // Made by Registry (registry.h). `dropped` counts refused label sets and
  // must outlive the family (the registry owns both); null only while the
  // registry wires its own dropped-series family.
  Family(FamilySpec spec, Counter* dropped) : FamilyBase(std::move(spec)), dropped_(dropped) {}

  // The series with `labels`, created (at zero) on first use. Never fails:
  // an invalid label set, or a new one beyond max_series, gets the overflow
  // series (see the banner). The reference stays valid while the registry
  // lives. Thread-safe.
  T& Add(const Labels& labels) {
    absl::StatusOr<T*> series = TryAdd(labels);
    if (series.ok()) return **series;
    if (!logged_refusal_.exchange(true)) {
      HSAP_LOG(ERROR) << "metrics: " << spec().name << ": series refused (logged once): "
                      << series.status();
    }
    absl::MutexLock lock(&mu_);
    if (overflow_ == nullptr) overflow_ = MakeSeries();
    return *overflow_;
  }

  // Like Add, but reports a refusal: INVALID_ARGUMENT for an invalid label
  // set, RESOURCE_EXHAUSTED for a new label set beyond max_series. Either
  // counts one dropped series. Thread-safe.
  absl::StatusOr<T*> TryAdd(const Labels& labels) {
    absl::Status valid = ValidateLabels(labels, T::kType);
    if (!valid.ok()) {
      CountDropped();
      return valid;
    }
    absl::MutexLock lock(&mu_);
    auto it = series_.find(labels);
    if (it != series_.end()) return it->second.get();
    if (series_.size() >= spec().max_series) {
      CountDropped();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "metric family %s already has %d label sets (the bound); new label set refused",
          spec().name, series_.size()));
    }
    std::unique_ptr<T>& slot = series_[labels];
    slot = MakeSeries();
    return slot.get();
  }

  // Label sets held (the overflow series not included).
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return series_.size();
  }

  MetricFamily Collect() const override {
    MetricFamily out{.name = spec().name, .help = spec().help, .type = T::kType};
    absl::MutexLock lock(&mu_);
    out.metrics.reserve(series_.size());
    for (const auto& [labels, series] : series_) {
      ClientMetric& metric = out.metrics.emplace_back();
      metric.labels = labels;
      series->CollectInto(&metric);
    }
    return out;
  }

 private:
  friend class Registry;  // wires dropped_ once, before sharing the family

  void set_dropped_counter(Counter* dropped) { dropped_ = dropped; }

  std::unique_ptr<T> MakeSeries() const {
    if constexpr (std::is_same_v<T, Histogram>) {
      return std::make_unique<Histogram>(spec().buckets);
    } else {
      return std::make_unique<T>();
    }
  }

  void CountDropped() {
    if (dropped_ != nullptr) dropped_->Increment();
  }

  Counter* dropped_;
  std::atomic<bool> logged_refusal_{false};
  mutable absl::Mutex mu_;
  // Ordered, so that Collect is deterministic.
  std::map<Labels, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<T> overflow_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_FAMILY_H_

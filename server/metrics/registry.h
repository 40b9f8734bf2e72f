// The metrics registry: families of counters, gauges and histograms, with
// an API shaped like prometheus-cpp's, for the daemon's /metrics endpoint.
//
// prometheus-cpp is not packaged in Debian 12, hence this small version.
// There is no global registry: the daemon owns one and passes it by pointer
// (STYLE.md: no singletons for metrics); tests make their own.
//
// Example:
//   Registry registry;
//   Family<Counter>& calls = BuildCounter()
//       .Name("hsap_calls_total").Help("Attention calls.").Register(registry);
//   calls.Add({{"op", "forward"}, {"status", "OK"}}).Increment();
//   Family<Histogram>& latency = BuildHistogram()
//       .Name("hsap_call_duration_seconds").Help("Call latency.")
//       .Buckets({0.001, 0.01, 0.1, 1}).Register(registry);
//   latency.Add({{"op", "forward"}}).Observe(0.02);
//   std::string text = SerializeText(registry.Collect());   // text_format.h
//
// Errors. Metric names, help text and buckets are constants of the code, so
// Register() aborts on a mistake (an invalid name, empty or non-UTF-8 help,
// bad buckets, or a name that clashes with another family) and the first
// test run catches it; TryRegister() returns the same checks as a status
// for names made at run time. Label sets are checked when a series is added
// (family.h: Add never fails, TryAdd reports).
//
// Differences from prometheus-cpp: histogram buckets belong to the family
// (Buckets() on the builder), not to each Add() call, so every series of a
// family has the same buckets; no constant labels, no Remove().
//
// Thread-safety: everything is thread-safe. Registering takes the registry's
// mutex; adding a series takes its family's; updating a series takes none.
// Collect() takes the registry's mutex, then each family's in turn.
#ifndef HSAP_SERVER_METRICS_REGISTRY_H_
#define HSAP_SERVER_METRICS_REGISTRY_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "server/metrics/counter.h"
#include "server/metrics/family.h"
#include "server/metrics/gauge.h"
#include "server/metrics/histogram.h"
#include "server/metrics/metric_family.h"

namespace hsap::metrics {

// The registry's own family: label sets refused by each family's bound (or
// invalid), labelled by family name. Every registered family has a series,
// zero until something is refused.
inline constexpr char kDroppedSeriesMetric[] = "hsap_metrics_dropped_series_total";

struct RegistryOptions {
  // Label sets one family may hold (family.h explains what happens beyond).
  size_t max_series_per_family = 1000;
};

class Registry final : public Collectable {
 public:
  explicit Registry(RegistryOptions options = {});
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  ~Registry() override;

  // Registers the family `spec` describes (spec.max_series is overwritten by
  // the registry's bound), or returns the existing one when a family with
  // the same name, type, help and buckets is already there.
  // INVALID_ARGUMENT: invalid name, help, or buckets. ALREADY_EXISTS: the
  // name, or a name its exposition uses (a histogram "x" also writes
  // x_bucket, x_sum and x_count), belongs to a different family.
  // Use the builders below rather than calling this directly.
  template <typename T>
  absl::StatusOr<Family<T>*> AddFamily(FamilySpec spec) ABSL_LOCKS_EXCLUDED(mu_) {
    spec.type = T::kType;
    spec.max_series = options_.max_series_per_family;
    absl::MutexLock lock(&mu_);
    absl::StatusOr<FamilyBase*> existing = CheckNewFamily(spec);
    if (!existing.ok()) return existing.status();
    if (*existing != nullptr) return static_cast<Family<T>*>(*existing);
    auto family = std::make_unique<Family<T>>(spec, nullptr);
    Family<T>* raw = family.get();
    families_[spec.name] = std::move(family);
    raw->set_dropped_counter(&dropped_->Add({{"family", spec.name}}));
    return raw;
  }

  // Every family with at least one series, sorted by name; series sorted by
  // labels.
  std::vector<MetricFamily> Collect() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Null when `spec` is new and may be added; the existing family when it
  // is an identical re-registration; an error otherwise.
  absl::StatusOr<FamilyBase*> CheckNewFamily(const FamilySpec& spec) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  Family<Counter>* dropped_;  // set in the constructor, owned by families_
};

// Builds and registers one family (prometheus-cpp's detail::Builder).
template <typename T>
class Builder {
 public:
  Builder& Name(std::string name) {
    spec_.name = std::move(name);
    return *this;
  }
  Builder& Help(std::string help) {
    spec_.help = std::move(help);
    return *this;
  }
  // Histograms only: finite, strictly increasing upper bounds (the +Inf
  // bucket is implicit).
  template <typename U = T, typename = std::enable_if_t<std::is_same_v<U, Histogram>>>
  Builder& Buckets(BucketBoundaries bounds) {
    spec_.buckets = std::move(bounds);
    return *this;
  }

  // The family, registered or found. Aborts on an error (see the banner).
  Family<T>& Register(Registry& registry) const {
    absl::StatusOr<Family<T>*> family = TryRegister(registry);
    HSAP_CHECK(family.ok()) << "metrics: registering " << spec_.name << ": " << family.status();
    return **family;
  }

  // The family, or Registry::AddFamily's error.
  absl::StatusOr<Family<T>*> TryRegister(Registry& registry) const {
    return registry.AddFamily<T>(spec_);
  }

 private:
  FamilySpec spec_;
};

inline Builder<Counter> BuildCounter() { return {}; }
inline Builder<Gauge> BuildGauge() { return {}; }
inline Builder<Histogram> BuildHistogram() { return {}; }

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_REGISTRY_H_

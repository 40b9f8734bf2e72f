// A value that goes up and down (prometheus-cpp's Gauge).
//
// Thread-safe and lock-free. Owned by its Family (family.h).
//
// Example:
//   Gauge& sessions = BuildGauge().Name("hsap_sessions").Help("...")
//                         .Register(registry).Add({});
//   sessions.Set(4);
#ifndef HSAP_SERVER_METRICS_GAUGE_H_
#define HSAP_SERVER_METRICS_GAUGE_H_

#include <atomic>

#include "server/metrics/metric_family.h"

namespace hsap::metrics {

class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;

  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1.0) { Add(amount); }
  void Decrement(double amount = 1.0) { Add(-amount); }

  double Value() const { return value_.load(std::memory_order_relaxed); }

  void CollectInto(ClientMetric* out) const { out->value = Value(); }

 private:
  void Add(double delta) {
    double current = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
    }
  }

  std::atomic<double> value_{0.0};
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_GAUGE_H_

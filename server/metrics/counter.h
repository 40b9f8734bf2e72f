// A monotonically increasing value (prometheus-cpp's Counter).
//
// Thread-safe and lock-free: one atomic compare-and-swap per Increment.
// Counters live in a Family (family.h), which owns them; callers keep the
// reference that Family::Add returns for as long as the registry lives.
//
// Example:
//   Counter& calls = calls_family.Add({{"op", "forward"}});
//   calls.Increment();
#ifndef HSAP_SERVER_METRICS_COUNTER_H_
#define HSAP_SERVER_METRICS_COUNTER_H_

#include <atomic>

#include "server/metrics/metric_family.h"

namespace hsap::metrics {

class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `amount`. A negative or NaN amount is ignored: a counter never goes
  // down (Prometheus reads a decrease as a restart).
  void Increment(double amount = 1.0) {
    if (!(amount >= 0)) return;
    double current = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(current, current + amount, std::memory_order_relaxed)) {
    }
  }

  double Value() const { return value_.load(std::memory_order_relaxed); }

  // Fills the value of a ClientMetric (labels are the family's business).
  void CollectInto(ClientMetric* out) const { out->value = Value(); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_COUNTER_H_

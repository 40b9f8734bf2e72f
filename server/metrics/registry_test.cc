#include "server/metrics/registry.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace hsap::metrics {
namespace {

// The value of the series of `name` with `labels` in a fresh Collect(), or
// -1 when there is none.
double CollectedValue(const Registry& registry, const std::string& name, const Labels& labels) {
  for (const MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const ClientMetric& metric : family.metrics) {
      if (metric.labels == labels) return metric.value;
    }
  }
  return -1;
}

double Dropped(const Registry& registry, const std::string& family) {
  return CollectedValue(registry, kDroppedSeriesMetric, {{"family", family}});
}

TEST(RegistryTest, RejectsInvalidMetricNames) {
  Registry registry;
  for (const char* name : {"", "1abc", "a-b", "a b", "é", "a.b"}) {
    absl::StatusOr<Family<Counter>*> family =
        BuildCounter().Name(name).Help("h").TryRegister(registry);
    ASSERT_FALSE(family.ok()) << name;
    EXPECT_EQ(family.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(family.status().message().find("is invalid"), absl::string_view::npos);
  }
  for (const char* name : {"a", "_a", "a:b_c9", ":x"}) {
    EXPECT_TRUE(BuildGauge().Name(name).Help("h").TryRegister(registry).ok()) << name;
  }
}

TEST(RegistryTest, RejectsMissingOrNonUtf8Help) {
  Registry registry;
  EXPECT_EQ(BuildCounter().Name("x_total").TryRegister(registry).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildCounter().Name("x_total").Help("bad \xff").TryRegister(registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, RejectsBadBuckets) {
  Registry registry;
  for (const BucketBoundaries& bounds :
       {BucketBoundaries{}, BucketBoundaries{1, 1}, BucketBoundaries{2, 1},
        BucketBoundaries{std::numeric_limits<double>::quiet_NaN()},
        BucketBoundaries{-std::numeric_limits<double>::infinity(), 1}}) {
    absl::StatusOr<Family<Histogram>*> family =
        BuildHistogram().Name("h_seconds").Help("h").Buckets(bounds).TryRegister(registry);
    EXPECT_EQ(family.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A trailing +Inf is allowed (it is implicit anyway).
  absl::StatusOr<Family<Histogram>*> ok =
      BuildHistogram()
          .Name("h_seconds")
          .Help("h")
          .Buckets({1, 2, std::numeric_limits<double>::infinity()})
          .TryRegister(registry);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ClientMetric collected;
  (*ok)->Add({}).CollectInto(&collected);
  EXPECT_EQ(collected.buckets.size(), 3u);  // 1, 2, +Inf
}

TEST(RegistryTest, IdenticalReRegistrationReturnsTheSameFamily) {
  Registry registry;
  Family<Counter>& first = BuildCounter().Name("c_total").Help("C.").Register(registry);
  Family<Counter>& second = BuildCounter().Name("c_total").Help("C.").Register(registry);
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(&first.Add({{"a", "1"}}), &second.Add({{"a", "1"}}));
}

TEST(RegistryTest, ConflictingRegistrationsAreAlreadyExists) {
  Registry registry;
  BuildCounter().Name("c_total").Help("C.").Register(registry);
  BuildHistogram().Name("lat").Help("L.").Buckets({1}).Register(registry);

  // Same name, other type or help.
  EXPECT_EQ(BuildGauge().Name("c_total").Help("C.").TryRegister(registry).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(BuildCounter().Name("c_total").Help("Other.").TryRegister(registry).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Same histogram name, other buckets.
  EXPECT_EQ(
      BuildHistogram().Name("lat").Help("L.").Buckets({2}).TryRegister(registry).status().code(),
      absl::StatusCode::kAlreadyExists);
  // A name the histogram's exposition uses, and the other way round.
  absl::Status clash = BuildGauge().Name("lat_count").Help("X.").TryRegister(registry).status();
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(clash.message().find("lat_count"), absl::string_view::npos) << clash;
  EXPECT_EQ(
      BuildHistogram().Name("c").Help("X.").Buckets({1}).TryRegister(registry).status().code(),
      absl::StatusCode::kOk);  // "c" writes c_bucket, c_sum, c_count: no clash
  EXPECT_EQ(BuildHistogram()
                .Name("c_total_x")
                .Help("X.")
                .Buckets({1})
                .TryRegister(registry)
                .status()
                .code(),
            absl::StatusCode::kOk);
  // The registry's own family is taken.
  EXPECT_EQ(
      BuildCounter().Name(kDroppedSeriesMetric).Help("Mine.").TryRegister(registry).status().code(),
      absl::StatusCode::kAlreadyExists);
}

TEST(RegistryDeathTest, RegisterAbortsOnAnInvalidName) {
  Registry registry;
  EXPECT_DEATH(BuildCounter().Name("bad name").Help("h").Register(registry), "bad name");
}

TEST(FamilyTest, TryAddRejectsInvalidLabelSetsAndCountsThem) {
  Registry registry;
  Family<Counter>& counters = BuildCounter().Name("c_total").Help("C.").Register(registry);
  Family<Histogram>& histograms =
      BuildHistogram().Name("h_seconds").Help("H.").Buckets({1}).Register(registry);

  for (const Labels& labels : {Labels{{"", "x"}}, Labels{{"1a", "x"}}, Labels{{"a-b", "x"}},
                               Labels{{"__reserved", "x"}}, Labels{{"ok", "bad \xc3\x28"}}}) {
    absl::StatusOr<Counter*> series = counters.TryAdd(labels);
    EXPECT_EQ(series.status().code(), absl::StatusCode::kInvalidArgument)
        << labels.begin()->first;
  }
  EXPECT_EQ(histograms.TryAdd({{"le", "1"}}).status().code(), absl::StatusCode::kInvalidArgument);
  // "le" is fine on a counter.
  EXPECT_TRUE(counters.TryAdd({{"le", "1"}}).ok());

  EXPECT_EQ(Dropped(registry, "c_total"), 5);
  EXPECT_EQ(Dropped(registry, "h_seconds"), 1);
  EXPECT_EQ(counters.size(), 1u);
}

TEST(FamilyTest, AddNeverFailsAndTheOverflowSeriesIsNotExported) {
  Registry registry;
  Family<Counter>& counters = BuildCounter().Name("c_total").Help("C.").Register(registry);
  Counter& bad = counters.Add({{"bad-name", "x"}});
  bad.Increment(5);
  Counter& also_bad = counters.Add({{"__x", "y"}});
  EXPECT_EQ(&bad, &also_bad);  // one overflow series per family
  EXPECT_EQ(counters.size(), 0u);
  EXPECT_EQ(Dropped(registry, "c_total"), 2);
  for (const MetricFamily& family : registry.Collect()) EXPECT_NE(family.name, "c_total");
}

TEST(FamilyTest, CardinalityIsBounded) {
  Registry registry({.max_series_per_family = 10});
  Family<Gauge>& gauges = BuildGauge().Name("g").Help("G.").Register(registry);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(gauges.TryAdd({{"i", absl::StrCat(i)}}).ok()) << i;
  }
  absl::StatusOr<Gauge*> refused = gauges.TryAdd({{"i", "10"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("g already has 10 label sets"),
            absl::string_view::npos)
      << refused.status();
  // Existing label sets are still found at the bound.
  absl::StatusOr<Gauge*> existing = gauges.TryAdd({{"i", "3"}});
  ASSERT_TRUE(existing.ok());
  (*existing)->Set(33);

  for (int i = 11; i < 15; ++i) gauges.Add({{"i", absl::StrCat(i)}}).Set(i);
  EXPECT_EQ(gauges.size(), 10u);
  EXPECT_EQ(Dropped(registry, "g"), 5);  // one TryAdd + four Adds
  EXPECT_EQ(CollectedValue(registry, "g", {{"i", "3"}}), 33);
  EXPECT_EQ(CollectedValue(registry, "g", {{"i", "11"}}), -1);  // not exported
}

TEST(FamilyTest, DefaultBoundIsOneThousand) {
  Registry registry;
  Family<Counter>& counters = BuildCounter().Name("c_total").Help("C.").Register(registry);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(counters.TryAdd({{"i", absl::StrCat(i)}}).ok());
  EXPECT_EQ(counters.TryAdd({{"i", "1000"}}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CounterTest, IgnoresNegativeAndNaN) {
  Counter counter;
  counter.Increment(2.5);
  counter.Increment(-1);
  counter.Increment(std::numeric_limits<double>::quiet_NaN());
  counter.Increment();
  EXPECT_EQ(counter.Value(), 3.5);
}

TEST(GaugeTest, SetIncrementDecrement) {
  Gauge gauge;
  gauge.Set(10);
  gauge.Increment();
  gauge.Increment(4);
  gauge.Decrement(20);
  EXPECT_EQ(gauge.Value(), -5);
}

TEST(HistogramTest, BucketsAreCumulativeAndBoundsInclusive) {
  Histogram histogram({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, -1.0}) histogram.Observe(v);
  histogram.Observe(std::numeric_limits<double>::quiet_NaN());  // ignored
  ClientMetric collected;
  histogram.CollectInto(&collected);
  ASSERT_EQ(collected.buckets.size(), 4u);
  EXPECT_EQ(collected.buckets[0].cumulative_count, 3u);  // -1, 0.5, 1
  EXPECT_EQ(collected.buckets[1].cumulative_count, 5u);  // + 1.5, 2
  EXPECT_EQ(collected.buckets[2].cumulative_count, 7u);  // + 3, 4
  EXPECT_EQ(collected.buckets[3].cumulative_count, 8u);  // + 5
  EXPECT_TRUE(std::isinf(collected.buckets[3].upper_bound));
  EXPECT_EQ(collected.sample_count, 8u);
  EXPECT_EQ(collected.sample_sum, 16.0);
}

// N threads hammer the same series, and add new series concurrently with
// collections; totals must be exact.
TEST(ConcurrencyTest, ExactTotalsUnderContention) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  Registry registry;
  Family<Counter>& counters = BuildCounter().Name("c_total").Help("C.").Register(registry);
  Family<Gauge>& gauges = BuildGauge().Name("g").Help("G.").Register(registry);
  Family<Histogram>& histograms =
      BuildHistogram().Name("h").Help("H.").Buckets({0.5, 1.5}).Register(registry);

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Add on every iteration on purpose: the mutex path must be safe too.
        counters.Add({{"shared", "yes"}}).Increment();
        gauges.Add({}).Increment(t % 2 == 0 ? 1 : -1);
        histograms.Add({{"t", absl::StrCat(t % 2)}}).Observe(i % 2);  // 0 or 1
        if (i % 1000 == 0) {
          counters.Add({{"thread", absl::StrCat(t)}, {"i", absl::StrCat(i)}}).Increment();
          registry.Collect();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(CollectedValue(registry, "c_total", {{"shared", "yes"}}), kThreads * kPerThread);
  EXPECT_EQ(CollectedValue(registry, "g", {}), 0);  // as many +1 as -1
  EXPECT_EQ(counters.size(), 1u + kThreads * (kPerThread / 1000));
  uint64_t total = 0;
  for (const MetricFamily& family : registry.Collect()) {
    if (family.name != "h") continue;
    for (const ClientMetric& metric : family.metrics) {
      EXPECT_EQ(metric.buckets[0].cumulative_count, kThreads / 2 * kPerThread / 2);
      EXPECT_EQ(metric.sample_sum, kThreads / 2 * kPerThread / 2);
      total += metric.sample_count;
    }
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kThreads) * kPerThread);
}

}  // namespace
}  // namespace hsap::metrics

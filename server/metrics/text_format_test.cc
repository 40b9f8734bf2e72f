#include "server/metrics/text_format.h"

#include <cstdlib>
#include <limits>

#include "gtest/gtest.h"
#include "server/metrics/registry.h"

namespace hsap::metrics {
namespace {

// Expected strings are Go's strconv.FormatFloat(v, 'g', -1, 64).
TEST(FormatValueTest, MatchesGoShortestG) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-2), "-2");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1.5), "1.5");
  EXPECT_EQ(FormatValue(0.00025), "0.00025");
  EXPECT_EQ(FormatValue(0.0001), "0.0001");
  EXPECT_EQ(FormatValue(0.00001), "1e-05");
  EXPECT_EQ(FormatValue(-0.000012345), "-1.2345e-05");
  EXPECT_EQ(FormatValue(123456), "123456");
  EXPECT_EQ(FormatValue(100000), "100000");
  EXPECT_EQ(FormatValue(1000000), "1e+06");
  EXPECT_EQ(FormatValue(1048576), "1.048576e+06");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(1.5e-300), "1.5e-300");
  EXPECT_EQ(FormatValue(12.3456), "12.3456");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatValue(9007199254740993.0), "9.007199254740992e+15");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

// Every printed value parses back to the same double.
TEST(FormatValueTest, RoundTrips) {
  for (double v : {0.1, 1.0 / 3, 2.0 / 3e-7, 6.02214076e23, 1e-320, 4.9e-324, 1.7976931348623157e308,
                   123456.789, 999999.9999999999, -7e-5}) {
    const std::string text = FormatValue(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST(EscapeTest, LabelValueEscapesBackslashQuoteNewline) {
  EXPECT_EQ(EscapeLabelValue(R"(a\b"c)"
                             "\n"
                             "d"),
            R"(a\\b\"c\nd)");
  EXPECT_EQ(EscapeLabelValue("plain é"), "plain é");
}

TEST(EscapeTest, HelpEscapesBackslashNewlineButNotQuote) {
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\nnext"), R"(say "hi"\\\nnext)");
}

TEST(SerializeTextTest, CounterAndGaugeWithLabelsGolden) {
  std::vector<MetricFamily> families = {
      {.name = "a_total",
       .help = "Counts\nthings \\ \"quoted\".",
       .type = MetricType::kCounter,
       .metrics = {{.labels = {{"op", "backward"}, {"x", "q\"\\\n"}}, .value = 2},
                   {.labels = {{"op", "forward"}}, .value = 1.5}}},
      {.name = "b", .help = "A gauge.", .type = MetricType::kGauge, .metrics = {{.value = -4}}},
  };
  EXPECT_EQ(SerializeText(families),
            "# HELP a_total Counts\\nthings \\\\ \"quoted\".\n"
            "# TYPE a_total counter\n"
            "a_total{op=\"backward\",x=\"q\\\"\\\\\\n\"} 2\n"
            "a_total{op=\"forward\"} 1.5\n"
            "# HELP b A gauge.\n"
            "# TYPE b gauge\n"
            "b -4\n");
}

TEST(SerializeTextTest, HistogramFromRegistryGolden) {
  Registry registry;
  Family<Histogram>& family = BuildHistogram()
                                  .Name("lat_seconds")
                                  .Help("Latency.")
                                  .Buckets({0.1, 1, 2.5})
                                  .Register(registry);
  Histogram& forward = family.Add({{"op", "forward"}});
  forward.Observe(0.05);
  forward.Observe(0.1);  // on the bound: counted in le="0.1"
  forward.Observe(2);
  forward.Observe(7);
  family.Add({}).Observe(1);

  std::vector<MetricFamily> collected = registry.Collect();
  ASSERT_EQ(collected.size(), 2u);  // hsap_metrics_dropped_series_total, lat_seconds
  EXPECT_EQ(collected[0].name, kDroppedSeriesMetric);
  EXPECT_EQ(SerializeText({collected[1]}),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{le=\"0.1\"} 0\n"
            "lat_seconds_bucket{le=\"1\"} 1\n"
            "lat_seconds_bucket{le=\"2.5\"} 1\n"
            "lat_seconds_bucket{le=\"+Inf\"} 1\n"
            "lat_seconds_sum 1\n"
            "lat_seconds_count 1\n"
            "lat_seconds_bucket{op=\"forward\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{op=\"forward\",le=\"1\"} 2\n"
            "lat_seconds_bucket{op=\"forward\",le=\"2.5\"} 3\n"
            "lat_seconds_bucket{op=\"forward\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{op=\"forward\"} 9.15\n"
            "lat_seconds_count{op=\"forward\"} 4\n");
}

TEST(SerializeTextTest, RegistryOutputIsSortedAndDeterministic) {
  Registry registry;
  // Registered and added out of order on purpose.
  Family<Gauge>& z = BuildGauge().Name("z_gauge").Help("Z.").Register(registry);
  Family<Counter>& a = BuildCounter().Name("a_total").Help("A.").Register(registry);
  z.Add({{"k", "2"}}).Set(2);
  z.Add({{"k", "10"}}).Set(10);
  z.Add({{"k", "1"}}).Set(1);
  a.Add({{"b", "x"}, {"a", "y"}}).Increment(3);

  const std::string text = SerializeText(registry.Collect());
  EXPECT_EQ(text,
            "# HELP a_total A.\n"
            "# TYPE a_total counter\n"
            "a_total{a=\"y\",b=\"x\"} 3\n"
            "# HELP hsap_metrics_dropped_series_total Label sets refused because a metric family "
            "reached its bound on label sets, or because the label set was invalid.\n"
            "# TYPE hsap_metrics_dropped_series_total counter\n"
            "hsap_metrics_dropped_series_total{family=\"a_total\"} 0\n"
            "hsap_metrics_dropped_series_total{family=\"hsap_metrics_dropped_series_total\"} 0\n"
            "hsap_metrics_dropped_series_total{family=\"z_gauge\"} 0\n"
            "# HELP z_gauge Z.\n"
            "# TYPE z_gauge gauge\n"
            "z_gauge{k=\"1\"} 1\n"
            "z_gauge{k=\"10\"} 10\n"
            "z_gauge{k=\"2\"} 2\n");
  EXPECT_EQ(SerializeText(registry.Collect()), text);
}

TEST(SerializeTextTest, FamilyWithoutSeriesIsOmitted) {
  Registry registry;
  BuildCounter().Name("unused_total").Help("Never added.").Register(registry);
  const std::string text = SerializeText(registry.Collect());
  EXPECT_EQ(text.find("# HELP unused_total"), std::string::npos) << text;
}

}  // namespace
}  // namespace hsap::metrics

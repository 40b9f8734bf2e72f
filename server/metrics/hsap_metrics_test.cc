#include "server/metrics/hsap_metrics.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/metrics/test_util.h"
#include "server/metrics/text_format.h"

namespace hsap::metrics {
namespace {

bool HasLine(const std::string& text, const std::string& line) {
  return absl::StrContains(text, "\n" + line + "\n") || absl::StartsWith(text, line + "\n");
}

class HsapMetricsTest : public ::testing::Test {
 protected:
  std::string Text() const { return SerializeText(registry_.Collect()); }

  Registry registry_;
  HsapMetrics metrics_{&registry_,
                       {.devices = {"cpu:0", "cpu:1"}, .version = "9.9.9-test"}};
};

TEST_F(HsapMetricsTest, FixedSeriesExistAtZero) {
  const std::string text = Text();
  for (const char* line : {
           "hsap_build_info{version=\"9.9.9-test\"} 1",
           "hsap_plan_cache_hits_total 0",
           "hsap_plan_cache_misses_total 0",
           "hsap_plan_cache_entries 0",
           "hsap_plan_cache_bytes 0",
           "hsap_plan_compile_seconds_count 0",
           "hsap_regions 0",
           "hsap_region_bytes 0",
           "hsap_sessions 0",
           "hsap_queue_depth 0",
           "hsap_kernel_scratch_cached_bytes 0",
           "hsap_transfer_bytes_total{direction=\"received\",tier=\"inter_node\"} 0",
           "hsap_transfer_bytes_total{direction=\"sent\",tier=\"intra_node\"} 0",
           "hsap_device_busy_seconds_total{device=\"cpu:0\"} 0",
           "hsap_device_busy_seconds_total{device=\"cpu:1\"} 0",
           "hsap_call_duration_seconds_count{op=\"forward\"} 0",
           "hsap_call_duration_seconds_count{op=\"backward\"} 0",
       }) {
    EXPECT_TRUE(HasLine(text, line)) << line << "\n" << text;
  }
  // No call happened: no hsap_calls_total series yet.
  EXPECT_FALSE(absl::StrContains(text, "hsap_calls_total{")) << text;
}

TEST_F(HsapMetricsTest, LimitsAndTheirRefusals) {
  EXPECT_TRUE(metrics_.SetLimit("max_sessions", 256));
  EXPECT_TRUE(metrics_.RecordLimitRefusal("max_sessions"));
  EXPECT_TRUE(metrics_.RecordLimitRefusal("max_sessions"));
  EXPECT_FALSE(metrics_.SetLimit("max_unicorns", 1));  // not a label value
  EXPECT_FALSE(metrics_.RecordLimitRefusal("group-7"));
  metrics_.SetRegionMappings(12);
  metrics_.SetCallGroups(3);
  EXPECT_TRUE(metrics_.SetLimit("kernel_scratch_cache_bytes", 64 << 20));
  metrics_.SetKernelScratchBytes(5 << 20);
  const std::string text = Text();
  for (const char* line : {"hsap_limit{limit=\"max_sessions\"} 256",
                           "hsap_limit_refusals_total{limit=\"max_sessions\"} 2",
                           "hsap_limit_refusals_total{limit=\"max_call_groups\"} 0",
                           "hsap_region_mappings 12", "hsap_call_groups 3",
                           "hsap_limit{limit=\"kernel_scratch_cache_bytes\"} 6.7108864e+07",
                           "hsap_kernel_scratch_cached_bytes 5.24288e+06"}) {
    EXPECT_TRUE(HasLine(text, line)) << line << "\n" << text;
  }
  EXPECT_FALSE(absl::StrContains(text, "max_unicorns"));
}

TEST_F(HsapMetricsTest, RecordCallCountsAndTimes) {
  metrics_.RecordCall(CallOp::kForward, "hsap", absl::StatusCode::kOk, 0.003);
  metrics_.RecordCall(CallOp::kForward, "hsap", absl::StatusCode::kOk, 0.003);
  metrics_.RecordCall(CallOp::kBackward, "ring", absl::StatusCode::kInvalidArgument, 0.0002);
  metrics_.RecordCall(CallOp::kForward, "group-7-of-session-42", absl::StatusCode::kOk, 1);
  metrics_.RecordCall(CallOp::kForward, "sap", static_cast<absl::StatusCode>(99), -5);
  const std::string text = Text();
  for (const char* line : {
           "hsap_calls_total{op=\"forward\",status=\"OK\",strategy=\"hsap\"} 2",
           "hsap_calls_total{op=\"backward\",status=\"INVALID_ARGUMENT\",strategy=\"ring\"} 1",
           "hsap_calls_total{op=\"forward\",status=\"OK\",strategy=\"other\"} 1",
           "hsap_calls_total{op=\"forward\",status=\"UNKNOWN\",strategy=\"sap\"} 1",
           "hsap_call_duration_seconds_bucket{op=\"forward\",le=\"0.0025\"} 1",  // the -5, as 0
           "hsap_call_duration_seconds_bucket{op=\"forward\",le=\"0.005\"} 3",
           "hsap_call_duration_seconds_bucket{op=\"forward\",le=\"1\"} 4",
           "hsap_call_duration_seconds_count{op=\"forward\"} 4",
           "hsap_call_duration_seconds_sum{op=\"forward\"} 1.006",
           "hsap_call_duration_seconds_bucket{op=\"backward\",le=\"0.0001\"} 0",
           "hsap_call_duration_seconds_bucket{op=\"backward\",le=\"0.00025\"} 1",
       }) {
    EXPECT_TRUE(HasLine(text, line)) << line << "\n" << text;
  }
  EXPECT_FALSE(absl::StrContains(text, "group-7")) << "a free-form string became a label";
}

TEST_F(HsapMetricsTest, TransfersCacheRegionsSessionsQueueDevices) {
  metrics_.RecordTransfer(TransferDirection::kSent, LinkTier::kInterNode, 1000);
  metrics_.RecordTransfer(TransferDirection::kSent, LinkTier::kInterNode, 24);
  metrics_.RecordTransfer(TransferDirection::kReceived, LinkTier::kIntraNode, 5);
  metrics_.RecordTransfer(TransferDirection::kReceived, LinkTier::kIntraNode, -5);  // ignored

  metrics_.SetPlanCacheStats({.hits = 10, .misses = 3, .entries = 3, .bytes = 4096});
  metrics_.SetPlanCacheStats({.hits = 12, .misses = 3, .entries = 2, .bytes = 2048});
  // A reset of the cache's counts re-bases: nothing is subtracted or added.
  metrics_.SetPlanCacheStats({.hits = 1, .misses = 0, .entries = 0, .bytes = 0});
  metrics_.SetPlanCacheStats({.hits = 4, .misses = 2, .entries = 1, .bytes = 100});
  metrics_.RecordPlanCompile(0.002);

  metrics_.SetRegions(3, 3 << 20);
  metrics_.SetSessions(2);
  metrics_.SetQueueDepth(5);
  metrics_.AddQueueDepth(-2);
  EXPECT_TRUE(metrics_.RecordDeviceBusy(1, 0.25));
  EXPECT_TRUE(metrics_.RecordDeviceBusy(1, 0.5));
  EXPECT_FALSE(metrics_.RecordDeviceBusy(2, 1));
  EXPECT_FALSE(metrics_.RecordDeviceBusy(-1, 1));

  const std::string text = Text();
  for (const char* line : {
           "hsap_transfer_bytes_total{direction=\"sent\",tier=\"inter_node\"} 1024",
           "hsap_transfer_bytes_total{direction=\"received\",tier=\"intra_node\"} 5",
           "hsap_plan_cache_hits_total 15",  // 10 + 2 + (reset) + 3
           "hsap_plan_cache_misses_total 5",  // 3 + 0 + (reset) + 2
           "hsap_plan_cache_entries 1",
           "hsap_plan_cache_bytes 100",
           "hsap_plan_compile_seconds_bucket{le=\"0.001\"} 0",
           "hsap_plan_compile_seconds_bucket{le=\"0.005\"} 1",
           "hsap_regions 3",
           "hsap_region_bytes 3.145728e+06",
           "hsap_sessions 2",
           "hsap_queue_depth 3",
           "hsap_device_busy_seconds_total{device=\"cpu:0\"} 0",
           "hsap_device_busy_seconds_total{device=\"cpu:1\"} 0.75",
       }) {
    EXPECT_TRUE(HasLine(text, line)) << line << "\n" << text;
  }
}

TEST_F(HsapMetricsTest, NamesFollowPrometheusConventions) {
  for (const MetricFamily& family : registry_.Collect()) {
    EXPECT_TRUE(absl::StartsWith(family.name, "hsap_")) << family.name;
    if (family.type == MetricType::kCounter) {
      EXPECT_TRUE(absl::EndsWith(family.name, "_total")) << family.name;
    } else {
      EXPECT_FALSE(absl::EndsWith(family.name, "_total")) << family.name;
    }
    if (family.type == MetricType::kHistogram) {
      EXPECT_TRUE(absl::EndsWith(family.name, "_seconds")) << family.name;
    }
  }
}

TEST_F(HsapMetricsTest, CallLabelSetsStayBounded) {
  // Every op x known strategy x status code, plus junk strategies: the
  // family can never exceed 2 x 8 x 17 label sets.
  for (int op = 0; op < 2; ++op) {
    for (absl::string_view strategy : {"ring", "allgather", "ulysses", "usp", "sap", "hsap",
                                       "auto", "x1", "x2", "x3"}) {
      for (int code = -1; code <= 20; ++code) {
        metrics_.RecordCall(static_cast<CallOp>(op), strategy, static_cast<absl::StatusCode>(code),
                            0.001);
      }
    }
  }
  for (const MetricFamily& family : registry_.Collect()) {
    if (family.name == "hsap_calls_total") {
      EXPECT_EQ(family.metrics.size(), 2u * 8u * 17u);
    }
    if (family.name == kDroppedSeriesMetric) {
      for (const ClientMetric& metric : family.metrics) EXPECT_EQ(metric.value, 0);
    }
  }
}

// promtool (Prometheus' own parser and linter) accepts the whole metric set
// with values recorded, and a device name that needs escaping.
TEST(HsapMetricsPromtoolTest, PromtoolAcceptsTheOutput) {
  Registry registry;
  HsapMetrics metrics(&registry, {.devices = {"cpu:0", "gpu \"0\"\\\nx"}});
  metrics.RecordCall(CallOp::kForward, "hsap", absl::StatusCode::kOk, 0.01);
  metrics.RecordCall(CallOp::kBackward, "ring", absl::StatusCode::kAborted, 2);
  metrics.RecordTransfer(TransferDirection::kSent, LinkTier::kIntraNode, 1 << 20);
  metrics.SetPlanCacheStats({.hits = 3, .misses = 1, .entries = 1, .bytes = 512});
  metrics.RecordPlanCompile(0.0004);
  metrics.RecordDeviceBusy(1, 1.5);
  const std::string text = SerializeText(registry.Collect());

  absl::StatusOr<testing::PromtoolResult> result = testing::RunPromtoolCheckMetrics(text);
  ASSERT_TRUE(result.ok()) << result.status();  // not installed: FAIL, never skip
  EXPECT_EQ(result->exit_code, 0) << result->output << "\n" << text;
  EXPECT_EQ(result->output, "") << text;
}

// The check above can fail: promtool does reject a malformed exposition.
TEST(HsapMetricsPromtoolTest, PromtoolRejectsBrokenText) {
  absl::StatusOr<testing::PromtoolResult> result = testing::RunPromtoolCheckMetrics(
      "# HELP x_total X.\n# TYPE x_total counter\nx_total{a=\"unterminated} 1\n");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0) << result->output;
}

}  // namespace
}  // namespace hsap::metrics

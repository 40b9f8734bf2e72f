// Every hsap_* metric name that deploy/ refers to — Prometheus alert rules,
// the scrape config, the Grafana dashboard — is one a real hsapd serves on
// /metrics, and the dashboard charts every family the daemon exports. The
// dashboard is also checked to be valid JSON with panels and queries.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gtest/gtest.h"
#include "server/metrics/test_util.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

std::string ReadRunfile(const std::string& path) {
  std::string full = path;
  if (const char* dir = getenv("TEST_SRCDIR")) full = std::string(dir) + "/hsap/" + path;
  std::ifstream in(full);
  EXPECT_TRUE(in.good()) << full;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool NameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == ':'; }

// Every token "hsap_[a-z0-9_]+" that is not part of a longer identifier,
// a file name or a glob.
std::set<std::string> ReferencedNames(const std::string& text) {
  std::set<std::string> names;
  for (size_t at = text.find("hsap_"); at != std::string::npos; at = text.find("hsap_", at + 1)) {
    if (at > 0 && NameChar(text[at - 1])) continue;
    size_t end = at;
    while (end < text.size() && (absl::ascii_islower(text[end]) || absl::ascii_isdigit(text[end]) ||
                                 text[end] == '_')) {
      ++end;
    }
    // Not a metric: a file name ("hsap_rules.yml") or a pattern ("hsap_*").
    if (end == at + 5 || (end < text.size() && (text[end] == '.' || text[end] == '*'))) continue;
    names.insert(text.substr(at, end - at));
  }
  return names;
}

// Names a live daemon serves after one real forward call (hsap_calls_total
// has no series, and so is not exported, before the first call): sample
// names, plus every family (from # TYPE) with its histogram series names.
struct Served {
  std::set<std::string> names;
  std::set<std::string> families;
};

Served Scrape() {
  DaemonOptions options;
  options.metrics_port = testing::FreePort();
  auto daemon = testing::StartInProcessDaemon(options);
  EXPECT_NE(daemon, nullptr);
  auto client = client::Client::Connect(daemon->socket());
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) {
    auto buffers =
        client::AttentionBuffers::Create(client->get(), {32, 2, 1, 32, DType::kFloat32}, "m");
    EXPECT_TRUE(buffers.ok()) << buffers.status();
    if (buffers.ok()) {
      (*buffers)->FillInputs(1);
      hsap::v1::CallId call;
      call.set_group("metrics");
      call.set_group_size(1);
      call.set_call_seq(1);
      auto r = (*client)->Forward(
          (*buffers)->ForwardRequest(call, client::DocumentMask({0, 10, 32}, true), {}));
      EXPECT_TRUE(r.ok()) << r.status();
    }
  }
  auto response = metrics::testing::HttpRequest(options.metrics_port, "GET", "/metrics");
  EXPECT_TRUE(response.ok()) << response.status();
  Served served;
  if (!response.ok()) return served;
  for (absl::string_view line : absl::StrSplit(response->body, '\n')) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      EXPECT_EQ(parts.size(), 2u) << line;
      if (parts.size() != 2) continue;
      served.families.insert(parts[0]);
      served.names.insert(parts[0]);
      if (parts[1] == "histogram") {
        for (const char* suffix : {"_bucket", "_sum", "_count"}) served.names.insert(parts[0] + suffix);
      }
    } else if (!line.empty() && line[0] != '#') {
      served.names.insert(std::string(line.substr(0, line.find_first_of("{ "))));
    }
  }
  return served;
}

class MetricNamesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { served_ = new Served(Scrape()); }
  static Served* served_;
};
Served* MetricNamesTest::served_ = nullptr;

TEST_F(MetricNamesTest, TheDaemonServesTheHsapFamilies) {
  EXPECT_GE(served_->families.size(), 15u) << absl::StrJoin(served_->families, " ");
  EXPECT_TRUE(served_->names.count("hsap_call_duration_seconds_bucket"));
  EXPECT_TRUE(served_->names.count("hsap_calls_total"));
}

TEST_F(MetricNamesTest, AlertRulesAndScrapeConfigUseServedNames) {
  for (const char* file : {"deploy/prometheus/hsap_rules.yml", "deploy/prometheus/prometheus.yml"}) {
    const std::set<std::string> used = ReferencedNames(ReadRunfile(file));
    for (const std::string& name : used) {
      EXPECT_TRUE(served_->names.count(name)) << file << " refers to " << name
                                              << ", which hsapd does not serve";
    }
  }
  const std::set<std::string> rules = ReferencedNames(ReadRunfile("deploy/prometheus/hsap_rules.yml"));
  for (const char* needed : {"hsap_calls_total", "hsap_call_duration_seconds_bucket",
                             "hsap_plan_cache_misses_total", "hsap_region_bytes"}) {
    EXPECT_TRUE(rules.count(needed)) << "no alert rule uses " << needed;
  }
}

TEST_F(MetricNamesTest, DashboardIsValidJsonAndChartsEveryFamily) {
  const std::string text = ReadRunfile("deploy/grafana/hsap_dashboard.json");
  google::protobuf::Struct dashboard;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text, &dashboard).ok());
  const auto& fields = dashboard.fields();
  ASSERT_TRUE(fields.count("panels"));
  const auto& panels = fields.at("panels").list_value().values();
  ASSERT_GE(panels.size(), 10);
  std::string exprs;
  for (const auto& panel : panels) {
    const auto& p = panel.struct_value().fields();
    ASSERT_TRUE(p.count("title") && p.count("targets")) << "panel without title or targets";
    for (const auto& target : p.at("targets").list_value().values()) {
      const std::string expr = target.struct_value().fields().at("expr").string_value();
      EXPECT_FALSE(expr.empty()) << p.at("title").string_value();
      exprs += expr + "\n";
    }
  }
  const std::set<std::string> used = ReferencedNames(text);
  for (const std::string& name : used) {
    EXPECT_TRUE(served_->names.count(name)) << "the dashboard refers to " << name
                                            << ", which hsapd does not serve";
  }
  const std::set<std::string> charted = ReferencedNames(exprs);
  for (const std::string& family : served_->families) {
    bool found = charted.count(family) > 0;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) found |= charted.count(family + suffix) > 0;
    EXPECT_TRUE(found) << "no dashboard panel charts " << family;
  }
}

}  // namespace
}  // namespace hsap

// A real Prometheus server (Debian's `prometheus`) scrapes a running hsapd
// (--metrics_port) on loopback after real attention calls, and the values
// read back through its query API. This is the check that the exposition is what Prometheus
// itself accepts, end to end: HTTP, headers, text format, names and labels.
//
// Everything stays on 127.0.0.1. Prometheus runs as a child process with
// PR_SET_PDEATHSIG, and is killed and its storage removed when the test
// ends, however it ends. No prometheus binary is a failure, not a skip
// (scripts/install_deps.sh installs it).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "server/metrics/hsap_metrics.h"
#include "tests/integration/test_daemon.h"
#include "server/metrics/http_exposer.h"
#include "server/metrics/registry.h"
#include "server/metrics/test_util.h"

namespace hsap::metrics {
namespace {

constexpr absl::Duration kReadBackTimeout = absl::Seconds(60);

// A child process, killed (TERM, then KILL after 5 s) and reaped on
// destruction.
class ChildProcess {
 public:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ <= 0 || exited_) return;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  // True (and reaped) when the child has exited.
  bool Exited() {
    if (!exited_ && waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
    return exited_;
  }
  int status() const { return status_; }

 private:
  pid_t pid_;
  bool exited_ = false;
  int status_ = 0;
};

// Removes a directory tree on destruction.
class TempDir {
 public:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Percent-encodes a PromQL expression for a query string.
std::string UrlEncode(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// The sample values of an instant-query response, in order, e.g. {"1"}.
std::vector<std::string> QueryValues(const std::string& json) {
  static const std::regex kValue(R"re("value":\[[0-9.e+-]+,"([^"]*)"\])re");
  std::vector<std::string> values;
  for (std::sregex_iterator it(json.begin(), json.end(), kValue), end; it != end; ++it) {
    values.push_back((*it)[1]);
  }
  return values;
}

TEST(PrometheusScrapeTest, PrometheusReadsBackTheHsapMetrics) {
  ASSERT_EQ(std::system("command -v prometheus >/dev/null 2>&1"), 0)
      << "prometheus is not installed (Debian package prometheus; run scripts/install_deps.sh)";

  // The daemon's side: hsapd serving /metrics, after three forward calls
  // (strategy sap) and one that failed validation.
  absl::StatusOr<int> metrics_port = testing::PickFreeLoopbackPort();
  ASSERT_TRUE(metrics_port.ok()) << metrics_port.status();
  DaemonOptions options;
  options.metrics_port = *metrics_port;
  auto daemon = hsap::testing::StartInProcessDaemon(options);
  auto client = client::Client::Connect(daemon->socket());
  ASSERT_TRUE(client.ok()) << client.status();
  auto buffers = client::AttentionBuffers::Create(client->get(), {64, 2, 2, 32, DType::kFloat32}, "m");
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  (*buffers)->FillInputs(1);
  hsap::v1::CallOptions call_options;
  call_options.set_strategy(hsap::v1::STRATEGY_SAP);
  for (int seq = 1; seq <= 3; ++seq) {
    hsap::v1::CallId id;
    id.set_group("metrics");
    id.set_group_size(1);
    id.set_call_seq(seq);
    auto r = (*client)->Forward(
        (*buffers)->ForwardRequest(id, client::DocumentMask({0, 30, 64}, true), call_options));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  {
    hsap::v1::CallId id;
    id.set_group("metrics");
    id.set_group_size(1);
    id.set_call_seq(4);
    auto bad = (*client)->Forward(
        (*buffers)->ForwardRequest(id, client::DocumentMask({0, 30, 63}, true), call_options));
    ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A live scrape of the daemon passes promtool's own checks.
  absl::StatusOr<testing::HttpResponse> live =
      testing::HttpRequest(*metrics_port, "GET", "/metrics", absl::Seconds(5));
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_EQ(live->status_code, 200);
  EXPECT_NE(live->body.find("hsap_calls_total{op=\"forward\",status=\"OK\",strategy=\"sap\"} 3"),
            std::string::npos)
      << live->body;
  absl::StatusOr<testing::PromtoolResult> lint = testing::RunPromtoolCheckMetrics(live->body);
  ASSERT_TRUE(lint.ok()) << lint.status();
  EXPECT_EQ(lint->exit_code, 0) << lint->output;
  struct {
    int port() const { return p; }
    int p;
  } exposer_port{*metrics_port};
  auto* exposer = &exposer_port;

  // Prometheus, scraping it every second, on another loopback port.
  absl::StatusOr<std::string> dir_path = testing::MakeTempDir("prometheus");
  ASSERT_TRUE(dir_path.ok()) << dir_path.status();
  TempDir dir(*dir_path);
  const std::string config = dir.path() + "/prometheus.yml";
  const std::string log = dir.path() + "/prometheus.log";
  std::ofstream(config) << absl::StrFormat(
      "global:\n"
      "  scrape_interval: 1s\n"
      "  scrape_timeout: 1s\n"
      "  evaluation_interval: 1s\n"
      "scrape_configs:\n"
      "  - job_name: hsapd\n"
      "    static_configs:\n"
      "      - targets: ['127.0.0.1:%d']\n",
      exposer->port());
  absl::StatusOr<int> web_port = testing::PickFreeLoopbackPort();
  ASSERT_TRUE(web_port.ok()) << web_port.status();

  const std::string config_flag = "--config.file=" + config;
  const std::string storage_flag = "--storage.tsdb.path=" + dir.path() + "/data";
  const std::string listen_flag = absl::StrCat("--web.listen-address=127.0.0.1:", *web_port);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed";
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out != nullptr) dup2(fileno(stdout), STDERR_FILENO);
    execlp("prometheus", "prometheus", config_flag.c_str(), storage_flag.c_str(),
           listen_flag.c_str(), "--storage.tsdb.retention.time=1h", "--log.level=info",
           static_cast<char*>(nullptr));
    _exit(127);
  }
  ChildProcess prometheus(pid);

  // Poll the query API until both values read back.
  const std::string build_info_query = "/api/v1/query?query=" + UrlEncode("hsap_build_info");
  const std::string calls_query =
      "/api/v1/query?query=" +
      UrlEncode("hsap_calls_total{op=\"forward\",strategy=\"sap\",status=\"OK\"}");
  const std::string up_query = "/api/v1/query?query=" + UrlEncode("up{job=\"hsapd\"}");
  std::string build_info_body, calls_body, up_body;
  bool read_back = false;
  const absl::Time deadline = absl::Now() + kReadBackTimeout;
  while (absl::Now() < deadline) {
    ASSERT_FALSE(prometheus.Exited())
        << "prometheus exited (status " << prometheus.status() << "):\n"
        << ReadFile(log);
    absl::StatusOr<testing::HttpResponse> build_info =
        testing::HttpRequest(*web_port, "GET", build_info_query, absl::Seconds(5));
    absl::StatusOr<testing::HttpResponse> calls =
        testing::HttpRequest(*web_port, "GET", calls_query, absl::Seconds(5));
    if (build_info.ok() && calls.ok() && build_info->status_code == 200 &&
        calls->status_code == 200) {
      build_info_body = build_info->body;
      calls_body = calls->body;
      if (!QueryValues(build_info_body).empty() && !QueryValues(calls_body).empty()) {
        absl::StatusOr<testing::HttpResponse> up =
            testing::HttpRequest(*web_port, "GET", up_query, absl::Seconds(5));
        if (up.ok()) up_body = up->body;
        read_back = true;
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  ASSERT_TRUE(read_back) << "no value read back within " << kReadBackTimeout
                         << "\nlast hsap_build_info answer: " << build_info_body
                         << "\nlast hsap_calls_total answer: " << calls_body
                         << "\nprometheus log:\n"
                         << ReadFile(log);

  EXPECT_EQ(QueryValues(build_info_body), std::vector<std::string>{"1"}) << build_info_body;
  EXPECT_NE(build_info_body.find(absl::StrCat("\"version\":\"", kVersion, "\"")),
            std::string::npos)
      << build_info_body;
  EXPECT_NE(build_info_body.find(absl::StrCat("\"instance\":\"127.0.0.1:", exposer->port())),
            std::string::npos)
      << build_info_body;
  EXPECT_EQ(QueryValues(calls_body), std::vector<std::string>{"3"}) << calls_body;
  EXPECT_EQ(QueryValues(up_body), std::vector<std::string>{"1"}) << up_body;
}

}  // namespace
}  // namespace hsap::metrics

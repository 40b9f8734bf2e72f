#include "server/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/metrics/registry.h"
#include "server/metrics/test_util.h"
#include "server/metrics/text_format.h"

namespace hsap::metrics {
namespace {

using testing::HttpRequest;
using testing::HttpResponse;

std::unique_ptr<Exposer> StartOrDie(const ExposerOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Create(options);
  EXPECT_TRUE(exposer.ok()) << exposer.status();
  return exposer.ok() ? *std::move(exposer) : nullptr;
}

// One exposer for the fixture's tests: stopping civetweb takes up to 2 s
// (its accept loop's poll quantum), so each test starting its own would
// make the suite slow for nothing.
class ExposerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new Registry();
    BuildCounter().Name("hits_total").Help("Hits.").Register(*registry_).Add({{"k", "v"}}).Increment(7);
    exposer_ = StartOrDie().release();
  }
  static void TearDownTestSuite() {
    delete exposer_;
    delete registry_;
  }
  void SetUp() override {
    ASSERT_NE(exposer_, nullptr);
    exposer_->RegisterCollectable(registry_);
  }
  void TearDown() override { exposer_->RemoveCollectable(registry_); }

  static Registry* registry_;
  static Exposer* exposer_;
};

Registry* ExposerTest::registry_ = nullptr;
Exposer* ExposerTest::exposer_ = nullptr;

TEST_F(ExposerTest, PortZeroPicksARealPort) {
  EXPECT_GT(exposer_->port(), 0);
  EXPECT_LT(exposer_->port(), 65536);
}

TEST_F(ExposerTest, GetMetricsServesTheTextFormat) {
  absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 200);
  EXPECT_EQ(response->Header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response->body, SerializeText(registry_->Collect()));
  EXPECT_NE(response->body.find("hits_total{k=\"v\"} 7\n"), std::string::npos) << response->body;
  EXPECT_EQ(response->Header("Content-Length"), std::to_string(response->body.size()));
}

TEST_F(ExposerTest, QueryStringIsIgnored) {
  absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", "/metrics?x=1");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 200);
}

TEST_F(ExposerTest, ValuesAreReadAtScrapeTime) {
  Gauge& gauge = BuildGauge().Name("changing").Help("C.").Register(*registry_).Add({});
  gauge.Set(1);
  absl::StatusOr<HttpResponse> before = HttpRequest(exposer_->port(), "GET", "/metrics");
  gauge.Set(2);
  absl::StatusOr<HttpResponse> after = HttpRequest(exposer_->port(), "GET", "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(before->body.find("\nchanging 1\n"), std::string::npos) << before->body;
  EXPECT_NE(after->body.find("\nchanging 2\n"), std::string::npos) << after->body;
}

TEST_F(ExposerTest, OtherPathsAre404) {
  for (const char* path : {"/", "/metric", "/metrics/", "/metricsx", "/favicon.ico"}) {
    absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", path);
    ASSERT_TRUE(response.ok()) << path << ": " << response.status();
    EXPECT_EQ(response->status_code, 404) << path;
  }
}

TEST_F(ExposerTest, OtherMethodsAre405) {
  for (const char* method : {"POST", "PUT", "DELETE", "HEAD"}) {
    absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), method, "/metrics");
    ASSERT_TRUE(response.ok()) << method << ": " << response.status();
    EXPECT_EQ(response->status_code, 405) << method;
    EXPECT_EQ(response->Header("Allow"), "GET") << method;
  }
}

TEST_F(ExposerTest, RemovedCollectableIsNoLongerServed) {
  exposer_->RemoveCollectable(registry_);
  absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", "/metrics");
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status_code, 200);
  EXPECT_EQ(response->body, "");
}

TEST_F(ExposerTest, SeveralCollectablesAreServedInRegistrationOrder) {
  Registry second;
  BuildGauge().Name("second_gauge").Help("S.").Register(second).Add({}).Set(2);
  exposer_->RegisterCollectable(&second);
  absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", "/metrics");
  exposer_->RemoveCollectable(&second);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body,
            SerializeText(registry_->Collect()) + SerializeText(second.Collect()));
}

// Scrapes from several clients while writers update: every response is
// complete, and the last one has the exact total.
TEST_F(ExposerTest, ConcurrentScrapesWhileUpdating) {
  constexpr int kWriters = 2;
  constexpr int kIncrements = 50000;
  Counter& counter =
      BuildCounter().Name("busy_total").Help("B.").Register(*registry_).Add({{"w", "all"}});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) counter.Increment();
    });
  }
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        absl::StatusOr<HttpResponse> response = HttpRequest(exposer_->port(), "GET", "/metrics");
        if (!response.ok() || response->status_code != 200 ||
            response->body.find("busy_total{w=\"all\"} ") == std::string::npos ||
            response->Header("Content-Length") != std::to_string(response->body.size())) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  absl::StatusOr<HttpResponse> last = HttpRequest(exposer_->port(), "GET", "/metrics");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_NE(last->body.find("busy_total{w=\"all\"} 100000\n"), std::string::npos) << last->body;
}

// Connects to the exposer and sends half a request header, then waits.
int HalfRequest(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char half[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  EXPECT_GT(send(fd, half, sizeof(half) - 1, MSG_NOSIGNAL), 0);
  return fd;
}

// Idle clients that send half a request header used to hold both of
// civetweb's threads for 10 s each: a scrape behind four of them took more
// than 13 s.
// Pages under a prefix: the handler's answer with the page headers (a
// policy that lets the page fetch nothing); GET only; the prefix and paths
// below it, nothing beside it; /metrics unchanged.
TEST(ExposerPagesTest, PrefixPagesAnswerGetWithTheHandlersPage) {
  std::unique_ptr<Exposer> exposer = StartOrDie();
  ASSERT_NE(exposer, nullptr);
  std::atomic<int> calls{0};
  exposer->AddPages("/plans", [&calls](const std::string& path) {
    ++calls;
    HttpPage page;
    if (path == "/plans/missing") {
      page.status = 404;
      page.content_type = "text/plain; charset=utf-8";
    }
    page.body = "<p>" + path + "</p>";
    return page;
  });
  for (const char* path : {"/plans", "/plans/", "/plans/abc"}) {
    absl::StatusOr<HttpResponse> r = HttpRequest(exposer->port(), "GET", path);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status();
    EXPECT_EQ(r->status_code, 200) << path;
    EXPECT_EQ(r->body, std::string("<p>") + path + "</p>");
    EXPECT_EQ(r->Header("Content-Type"), "text/html; charset=utf-8");
    EXPECT_EQ(r->Header("Content-Security-Policy").rfind("default-src 'none';", 0), 0u)
        << r->headers;
    EXPECT_EQ(r->Header("X-Content-Type-Options"), "nosniff");
    EXPECT_EQ(r->Header("Cache-Control"), "no-store");
  }
  absl::StatusOr<HttpResponse> missing = HttpRequest(exposer->port(), "GET", "/plans/missing");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status_code, 404);
  EXPECT_EQ(missing->Header("Content-Type"), "text/plain; charset=utf-8");
  const int before = calls.load();
  absl::StatusOr<HttpResponse> post = HttpRequest(exposer->port(), "POST", "/plans");
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_EQ(post->status_code, 405);
  EXPECT_EQ(post->Header("Allow"), "GET");
  absl::StatusOr<HttpResponse> beside = HttpRequest(exposer->port(), "GET", "/plansx");
  ASSERT_TRUE(beside.ok()) << beside.status();
  EXPECT_EQ(beside->status_code, 404);
  EXPECT_EQ(calls.load(), before);
  absl::StatusOr<HttpResponse> metrics = HttpRequest(exposer->port(), "GET", "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status_code, 200);
  EXPECT_EQ(metrics->Header("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
}

TEST(ExposerSlowClientsTest, IdleHalfRequestsDoNotBlockAScrape) {
  Registry registry;
  BuildCounter().Name("up_total").Help("Up.").Register(registry).Add({}).Increment(1);
  auto exposer = StartOrDie();
  ASSERT_NE(exposer, nullptr);
  exposer->RegisterCollectable(&registry);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(HalfRequest(exposer->port()));
  absl::SleepFor(absl::Milliseconds(100));  // all four are with civetweb now
  absl::Time start = absl::Now();
  auto r = HttpRequest(exposer->port(), "GET", "/metrics", absl::Seconds(20));
  const absl::Duration four = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status_code, 200);
  EXPECT_NE(r->body.find("up_total 1"), std::string::npos);
  EXPECT_LT(four, absl::Seconds(1));
  // More idle clients than threads: a scrape waits about one request
  // timeout per num_threads of them, not forever.
  for (int i = 0; i < 12; ++i) idle.push_back(HalfRequest(exposer->port()));
  absl::SleepFor(absl::Milliseconds(100));
  start = absl::Now();
  r = HttpRequest(exposer->port(), "GET", "/metrics", absl::Seconds(20));
  const absl::Duration sixteen = absl::Now() - start;
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status_code, 200);
  EXPECT_LT(sixteen, absl::Milliseconds(ExposerOptions().request_timeout_ms * 2 + 1500));
  std::printf("scrape behind 4 idle clients: %s; behind 16: %s\n",
              absl::FormatDuration(four).c_str(), absl::FormatDuration(sixteen).c_str());
  for (int fd : idle) close(fd);
}

TEST(ExposerLifetimeTest, DestructionStopsListening) {
  std::unique_ptr<Exposer> exposer = StartOrDie();
  ASSERT_NE(exposer, nullptr);
  const int port = exposer->port();
  ASSERT_TRUE(HttpRequest(port, "GET", "/metrics").ok());
  exposer.reset();
  absl::StatusOr<HttpResponse> after = HttpRequest(port, "GET", "/metrics");
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
}

TEST(ExposerCreateTest, MalformedAddressesAreInvalidArgument) {
  for (const char* address : {"", "127.0.0.1", ":8080", "127.0.0.1:", "127.0.0.1:http",
                              "127.0.0.1:65536", "127.0.0.1:8080s", "127.0.0.1:-1"}) {
    absl::StatusOr<std::unique_ptr<Exposer>> exposer = Exposer::Create({.bind_address = address});
    EXPECT_EQ(exposer.status().code(), absl::StatusCode::kInvalidArgument) << address;
  }
  EXPECT_EQ(Exposer::Create({.num_threads = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExposerCreateTest, PortInUseIsUnavailable) {
  std::unique_ptr<Exposer> first = StartOrDie();
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<Exposer>> second =
      Exposer::Create({.bind_address = "127.0.0.1:" + std::to_string(first->port())});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
}

TEST(ExposerCreateTest, NonLocalAddressIsUnavailable) {
  // TEST-NET-1 (RFC 5737): never assigned to this machine.
  absl::StatusOr<std::unique_ptr<Exposer>> exposer =
      Exposer::Create({.bind_address = "192.0.2.1:0"});
  EXPECT_EQ(exposer.status().code(), absl::StatusCode::kUnavailable) << exposer.status();
}

}  // namespace
}  // namespace hsap::metrics

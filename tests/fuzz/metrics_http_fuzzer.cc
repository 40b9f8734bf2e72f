// Fuzzes the metrics endpoint (server/metrics/http_exposer.h): an Exposer
// listens on loopback (port 0) in this process and every input is sent as a
// raw HTTP request over a fresh TCP connection (then the write side is shut
// and the answer read to EOF). Civetweb itself is the uninstrumented system
// library; what runs instrumented is the Exposer's handler, the registry's
// collection and the text format.
//
// Modes (first byte): even -> raw request bytes; odd -> the input is a label
// value set on a gauge series (TryAdd), then "GET /metrics" is scraped over
// HTTP and the body checked line by line: the text format must escape the
// value so that every line is a comment or a sample of a known family.
//
// Properties: every answer starts with an HTTP status line; /metrics GET answers
// 200 with exactly Scrape()'s body; other paths 404; other methods 405.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "server/metrics/http_exposer.h"
#include "server/metrics/registry.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::metrics {
namespace {

struct Fixture {
  Registry registry{RegistryOptions{.max_series_per_family = 64}};
  Family<Gauge>* labelled = nullptr;
  std::unique_ptr<Exposer> exposer;
  Fixture() {
    BuildCounter().Name("hsap_fuzz_requests_total").Help("Requests.").Register(registry).Add({{"k", "v"}}).Increment(3);
    BuildHistogram().Name("hsap_fuzz_seconds").Help("Latency.").Buckets({0.1, 1, 10}).Register(registry).Add({}).Observe(0.5);
    labelled = &BuildGauge().Name("hsap_fuzz_label").Help("Fuzzed label values.").Register(registry);
    auto e = Exposer::Create({.bind_address = "127.0.0.1:0", .num_threads = 2, .request_timeout_ms = 500});
    FUZZ_CHECK(e.ok());
    exposer = std::move(*e);
    exposer->RegisterCollectable(&registry);
  }
};

Fixture& F() {
  static Fixture* f = new Fixture;
  return *f;
}

// Sends `request`, half-closes, returns everything the server wrote.
std::string Exchange(const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(F().exposer->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{.tv_sec = 20, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  FUZZ_CHECK(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early on a bad request
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string response;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

int StatusOf(const std::string& response) {
  // "HTTP/x.y NNN reason". Civetweb's own error answers echo the request's
  // version token as is (spaces, even line breaks: "HTTP/2.1 505",
  // "HTTP//metrics HTTP/1.0\r\n 400"): take the first " NNN " in the head.
  if (!absl::StartsWith(response, "HTTP/")) return -1;
  const std::string head = response.substr(0, response.find("\r\n\r\n"));
  for (size_t i = 0; i + 4 < head.size(); ++i) {
    if (head[i] == ' ' && isdigit(head[i + 1]) && isdigit(head[i + 2]) && isdigit(head[i + 3]) &&
        head[i + 4] == ' ') {
      return std::atoi(head.substr(i + 1, 3).c_str());
    }
  }
  return -1;
}

std::string BodyOf(const std::string& response) {
  const size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

void FuzzRaw(const std::string& request) {
  const std::string response = Exchange(request);
  if (response.empty()) return;  // civetweb may drop a connection it cannot parse
  const int status = StatusOf(response);
  if (status < 200 || status > 599) std::fprintf(stderr, "response: %.200s\n", response.c_str());
  FUZZ_CHECK(status >= 200 && status <= 599);
  // A well-formed request line for /metrics is answered by our handler.
  if (absl::StartsWith(request, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") ||
      request == "GET /metrics HTTP/1.0\r\n\r\n") {
    FUZZ_CHECK(status == 200);
    FUZZ_CHECK(BodyOf(response) == F().exposer->Scrape());
  }
  if (absl::StartsWith(request, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")) {
    FUZZ_CHECK(status == 405);
  }
  if (absl::StartsWith(request, "GET /other HTTP/1.1\r\nHost: x\r\n\r\n")) FUZZ_CHECK(status == 404);
}

void FuzzLabel(const std::string& value) {
  auto gauge = F().labelled->TryAdd({{"v", value}});
  if (gauge.ok()) (*gauge)->Set(static_cast<double>(value.size()));
  const std::string response = Exchange("GET /metrics HTTP/1.0\r\n\r\n");
  FUZZ_CHECK(StatusOf(response) == 200);
  const std::string body = BodyOf(response);
  // A loaded machine can starve civetweb's thread past the receive timeout:
  // a body shorter than its Content-Length is inconclusive, not a failure.
  const size_t cl = response.find("Content-Length: ");
  FUZZ_CHECK(cl != std::string::npos);
  if (body.size() < std::strtoull(response.c_str() + cl + 16, nullptr, 10)) return;
  if (body != F().exposer->Scrape()) {
    std::fprintf(stderr, "HTTP body (%zu bytes) != Scrape() (%zu bytes); response head: %.300s\n",
                 body.size(), F().exposer->Scrape().size(), response.c_str());
  }
  FUZZ_CHECK(body == F().exposer->Scrape());
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const bool known = absl::StartsWith(line, "hsap_fuzz_") ||
                       absl::StartsWith(line, "hsap_metrics_dropped_series_total");
    if (!known) std::fprintf(stderr, "unexpected line: %.*s\n", static_cast<int>(line.size()), line.data());
    FUZZ_CHECK(known);
  }
}

}  // namespace
}  // namespace hsap::metrics

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  hsap::metrics::F();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    hsap::metrics::FuzzLabel(rest);
  } else {
    hsap::metrics::FuzzRaw(rest);
  }
  return 0;
}

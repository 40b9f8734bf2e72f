// Test helpers for the metrics tests: a minimal HTTP/1.1 client over a
// plain TCP socket (so the tests check the bytes on the wire, not a
// library's reading of them), and promtool run as a subprocess.
#ifndef HSAP_SERVER_METRICS_TEST_UTIL_H_
#define HSAP_SERVER_METRICS_TEST_UTIL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace hsap::metrics::testing {

struct HttpResponse {
  int status_code = 0;
  std::string headers;  // raw header lines, "\r\n"-separated, status line excluded
  std::string body;     // de-chunked when Transfer-Encoding is chunked

  // The value of header `name` (case-insensitive), or "" when absent.
  std::string Header(absl::string_view name) const;
};

// Sends `method path` to 127.0.0.1:`port` with Connection: close and reads
// the whole response. UNAVAILABLE when the connection fails,
// DEADLINE_EXCEEDED past `timeout`, DATA_LOSS for a malformed response.
absl::StatusOr<HttpResponse> HttpRequest(int port, absl::string_view method,
                                         absl::string_view path,
                                         absl::Duration timeout = absl::Seconds(10));

// GET /metrics at 127.0.0.1:`port`: the body (HttpRequest's errors, or
// UNAVAILABLE naming the status code when it is not 200).
absl::StatusOr<std::string> ScrapeMetrics(int port, absl::Duration timeout = absl::Seconds(10));

// The value of the sample line `series <value>` of exposition `text`, where
// series is a name with its labels as written (`hsap_limit{limit="max_peers"}`);
// -1 when there is no such line.
double SampleValue(absl::string_view text, absl::string_view series);

// SampleValue of a fresh scrape; -1 when the scrape fails too.
double ScrapeSample(int port, absl::string_view series,
                    absl::Duration timeout = absl::Seconds(10));

// What `promtool check metrics` said about `text`.
struct PromtoolResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `promtool check metrics` with `text` on stdin. NOT_FOUND when
// promtool is not installed (scripts/install_deps.sh installs it; callers
// fail the test on that, never skip).
absl::StatusOr<PromtoolResult> RunPromtoolCheckMetrics(absl::string_view text);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then
// closed), for servers that cannot report the port they chose.
absl::StatusOr<int> PickFreeLoopbackPort();

// A fresh directory under $TEST_TMPDIR (or /tmp).
absl::StatusOr<std::string> MakeTempDir(absl::string_view prefix);

}  // namespace hsap::metrics::testing

#endif  // HSAP_SERVER_METRICS_TEST_UTIL_H_

#include "server/metrics/http_exposer.h"

#include <civetweb.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "server/metrics/text_format.h"

namespace hsap::metrics {
namespace {

constexpr char kMetricsPath[] = "/metrics";

// OK when `address` is "host:port" with a non-empty host and a decimal port
// in [0, 65535]. civetweb's own syntax is wider ("8080s", "+8080", ports
// alone), which is refused here so that the flag means one thing.
absl::Status ValidateBindAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metrics bind address \"%s\" is not host:port", address));
  }
  const std::string port_text = address.substr(colon + 1);
  int port = -1;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metrics bind address \"%s\": port \"%s\" is not a number in [0, 65535]", address,
        port_text));
  }
  return absl::OkStatus();
}

void InitCivetwebOnce() {
  // Process-wide civetweb state (its own, not ours): initialized once and
  // kept for the life of the process.
  static std::once_flag once;
  std::call_once(once, [] { mg_init_library(0); });
}

int Send(mg_connection* conn, int status, const char* reason, const char* content_type,
         const std::string& body, const char* extra_headers) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\n"
            "Content-Type: %s\r\n"
            "Content-Length: %zu\r\n"
            "%s"
            "Connection: close\r\n\r\n",
            status, reason, content_type, body.size(), extra_headers);
  if (!body.empty()) mg_write(conn, body.data(), body.size());
  return status;
}

int SendText(mg_connection* conn, int status, const char* reason, const std::string& body,
             const char* extra_headers) {
  return Send(conn, status, reason,
              status == 200 ? kTextContentType : "text/plain; charset=utf-8", body, extra_headers);
}

// Pages may run their own inline script and style, and fetch nothing.
constexpr char kPageHeaders[] =
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Cache-Control: no-store\r\n";

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
  }
  return "Status";
}

bool UnderPrefix(const std::string& uri, const std::string& prefix) {
  return uri.compare(0, prefix.size(), prefix) == 0 &&
         (uri.size() == prefix.size() || uri[prefix.size()] == '/');
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exposer>> Exposer::Create(const ExposerOptions& options) {
  absl::Status address = ValidateBindAddress(options.bind_address);
  if (!address.ok()) return address;
  if (options.request_timeout_ms < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "metrics request_timeout_ms is %d; must be >= 1", options.request_timeout_ms));
  }
  if (options.num_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("metrics num_threads is %d; must be >= 1", options.num_threads));
  }
  InitCivetwebOnce();

  std::unique_ptr<Exposer> exposer(new Exposer());
  const std::string threads = absl::StrCat(options.num_threads);
  const std::string timeout = absl::StrCat(options.request_timeout_ms);
  const char* config[] = {
      "listening_ports",    options.bind_address.c_str(),
      "num_threads",        threads.c_str(),
      "request_timeout_ms", timeout.c_str(),
      "enable_keep_alive",  "no",
      // Closing a connection waits at most this long for the client to
      // read the rest (a reader that never does cannot hold the thread).
      "linger_timeout_ms",  timeout.c_str(),
      nullptr,
  };
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = &Exposer::LogMessage;
  mg_init_data init{.callbacks = &callbacks, .user_data = nullptr, .configuration_options = config};
  unsigned error_code = 0;
  char error_text[256] = {0};
  mg_error_data error{.code = &error_code, .text = error_text, .text_buffer_size = sizeof(error_text)};
  exposer->context_ = mg_start2(&init, &error);
  if (exposer->context_ == nullptr) {
    return absl::UnavailableError(absl::StrFormat("metrics: cannot listen on %s: %s (code %u)",
                                                  options.bind_address, error_text, error_code));
  }
  // "/" matches every URI; the handler answers 404 itself for the others.
  mg_set_request_handler(exposer->context_, "/", &Exposer::HandleRequest, exposer.get());

  mg_server_port ports[4];
  const int num_ports = mg_get_server_ports(exposer->context_, 4, ports);
  if (num_ports < 1 || ports[0].port <= 0) {
    return absl::InternalError(
        absl::StrFormat("metrics: civetweb reports no bound port for %s", options.bind_address));
  }
  exposer->port_ = ports[0].port;
  return exposer;
}

Exposer::~Exposer() {
  if (context_ != nullptr) mg_stop(context_);
}

void Exposer::RegisterCollectable(const Collectable* collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(collectable);
}

void Exposer::RemoveCollectable(const Collectable* collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.erase(std::remove(collectables_.begin(), collectables_.end(), collectable),
                      collectables_.end());
}

void Exposer::AddPages(const std::string& prefix, PageHandler handler) {
  absl::MutexLock lock(&mu_);
  pages_.push_back({prefix, std::move(handler)});
}

std::string Exposer::Scrape() const {
  std::string body;
  // Held across the collection, so that RemoveCollectable waits for it.
  absl::ReaderMutexLock lock(&mu_);
  for (const Collectable* collectable : collectables_) {
    for (const MetricFamily& family : collectable->Collect()) AppendFamilyText(family, &body);
  }
  return body;
}

int Exposer::HandleRequest(mg_connection* conn, void* self) {
  const mg_request_info* request = mg_get_request_info(conn);
  const char* uri = request->local_uri != nullptr ? request->local_uri : "";
  const Exposer* exposer = static_cast<const Exposer*>(self);
  if (std::strcmp(uri, kMetricsPath) != 0) {
    // Held across the handler, like a scrape.
    absl::ReaderMutexLock lock(&exposer->mu_);
    for (const Pages& pages : exposer->pages_) {
      if (!UnderPrefix(uri, pages.prefix)) continue;
      if (request->request_method == nullptr ||
          std::strcmp(request->request_method, "GET") != 0) {
        return SendText(conn, 405, "Method Not Allowed", "only GET is allowed\n",
                        "Allow: GET\r\n");
      }
      const HttpPage page = pages.handler(uri);
      return Send(conn, page.status, Reason(page.status), page.content_type.c_str(), page.body,
                  kPageHeaders);
    }
    return SendText(conn, 404, "Not Found", "not found; metrics are at /metrics\n", "");
  }
  if (request->request_method == nullptr || std::strcmp(request->request_method, "GET") != 0) {
    return SendText(conn, 405, "Method Not Allowed", "only GET is allowed\n", "Allow: GET\r\n");
  }
  return SendText(conn, 200, "OK", exposer->Scrape(), "");
}

int Exposer::LogMessage(const mg_connection* /*conn*/, const char* message) {
  HSAP_LOG(WARNING) << "metrics http: " << message;
  return 1;  // handled: civetweb prints nothing itself
}

}  // namespace hsap::metrics

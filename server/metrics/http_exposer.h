// Serves the text exposition format over HTTP (prometheus-cpp's Exposer),
// with civetweb, and the pages other parts register under a path prefix
// (hsapd: the plan viewer under /plans, server/viewer/plans_http.h).
//
// Slow and idle clients: keep-alive is off (one request per connection),
// and a connection that does not progress for request_timeout_ms is
// dropped, so half-sent requests cannot hold civetweb's threads.
//
//   GET /metrics       200, Content-Type: text/plain; version=0.0.4;
//                      charset=utf-8, the families of every registered
//                      Collectable in registration order
//   GET <prefix>, GET <prefix>/...
//                      what the handler registered with AddPages(prefix)
//                      answers; text/html answers carry a
//                      Content-Security-Policy that lets the page fetch
//                      nothing
//   other method       405 (with Allow: GET) on /metrics and the pages
//   any other path     404
//
// The server runs on civetweb's own threads (ExposerOptions::num_threads)
// from Create() until the Exposer is destroyed (RAII: the destructor stops
// civetweb and waits for requests in flight).
//
// Example:
//   Registry registry;
//   HSAP_ASSIGN_OR_RETURN(std::unique_ptr<Exposer> exposer,
//                         Exposer::Create({.bind_address = "127.0.0.1:0"}));
//   exposer->RegisterCollectable(&registry);
//   HSAP_LOG(INFO) << "metrics on port " << exposer->port();
#ifndef HSAP_SERVER_METRICS_HTTP_EXPOSER_H_
#define HSAP_SERVER_METRICS_HTTP_EXPOSER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/metrics/metric_family.h"

struct mg_context;
struct mg_connection;

namespace hsap::metrics {

struct ExposerOptions {
  // "host:port" with an IP literal host ("127.0.0.1", "0.0.0.0", "[::1]");
  // port 0 picks a free port (see Exposer::port()).
  std::string bind_address = "127.0.0.1:0";
  // civetweb worker threads: connections served at once. Each connection
  // holds one from accept to its last byte, so idle or slow clients up to
  // this many delay nobody (hsapd --metrics_threads).
  int num_threads = 8;
  // A connection whose request (or our answer) does not move for this long
  // is dropped, freeing its thread: beyond num_threads idle clients, a
  // scrape waits at most about this long per num_threads of them
  // (hsapd --metrics_request_timeout_ms). A scrape on loopback takes
  // milliseconds.
  int request_timeout_ms = 2000;
};

// A page handler's answer.
struct HttpPage {
  int status = 200;
  std::string content_type = "text/html; charset=utf-8";
  std::string body;
};
// Answers GET `path` (the request's decoded path, without the query).
// Called on civetweb's threads, concurrently: must be thread-safe.
using PageHandler = std::function<HttpPage(const std::string& path)>;

class Exposer {
 public:
  // Starts serving. INVALID_ARGUMENT for a malformed bind_address or
  // num_threads < 1; UNAVAILABLE when civetweb cannot listen (address in
  // use, not a local address), with civetweb's message.
  static absl::StatusOr<std::unique_ptr<Exposer>> Create(const ExposerOptions& options);

  Exposer(const Exposer&) = delete;
  Exposer& operator=(const Exposer&) = delete;
  // Stops listening and waits for requests in flight. Takes up to 2 s:
  // civetweb's accept loop notices the stop at its next poll timeout (a
  // compile-time 2 s quantum in civetweb 1.15).
  ~Exposer();

  // Adds `collectable` to what /metrics serves. Thread-safe.
  // REQUIRES: `collectable` outlives this Exposer, or is removed first.
  void RegisterCollectable(const Collectable* collectable) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes it; a scrape in progress finishes first, so the caller may
  // destroy `collectable` once this returns. Thread-safe.
  void RemoveCollectable(const Collectable* collectable) ABSL_LOCKS_EXCLUDED(mu_);

  // Serves GET `prefix` (e.g. "/plans") and every path below it
  // ("/plans/...") with `handler`. Thread-safe. REQUIRES: `prefix` starts
  // with '/', does not end with one, is not "/metrics" and is not added
  // twice; what `handler` refers to outlives this Exposer.
  void AddPages(const std::string& prefix, PageHandler handler) ABSL_LOCKS_EXCLUDED(mu_);

  // The TCP port actually bound (the chosen one when asked for port 0).
  int port() const { return port_; }

  // The body GET /metrics returns now. Thread-safe.
  std::string Scrape() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Exposer() = default;
  static int HandleRequest(mg_connection* conn, void* self);
  static int LogMessage(const mg_connection* conn, const char* message);

  mg_context* context_ = nullptr;
  int port_ = 0;
  mutable absl::Mutex mu_;
  std::vector<const Collectable*> collectables_ ABSL_GUARDED_BY(mu_);
  struct Pages {
    std::string prefix;
    PageHandler handler;
  };
  std::vector<Pages> pages_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_HTTP_EXPOSER_H_

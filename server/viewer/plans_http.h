// The plan viewer over HTTP: what hsapd's metrics port answers under
// /plans (server/daemon.cc wires it into metrics::Exposer).
//
//   GET /plans, /plans/      the cache's index page (plan_page.h)
//   GET /plans/<key>         that plan's page; 404 when it is not cached,
//                            400 when <key> is not 32 hex digits
//
// The pages are read-only views of the cache: Show() and List(), which
// neither count as hits nor change the LRU order. Access is that of the
// metrics port (docs/plan_viewer.md, "Plan cache inspection").
#ifndef HSAP_SERVER_VIEWER_PLANS_HTTP_H_
#define HSAP_SERVER_VIEWER_PLANS_HTTP_H_

#include <string>

#include "absl/strings/string_view.h"
#include "server/plan/plan_cache.h"

namespace hsap::viewer {

// The path prefix the pages live under.
inline constexpr absl::string_view kPlansPath = "/plans";

struct HttpAnswer {
  int status = 200;
  std::string content_type = "text/html; charset=utf-8";
  std::string body;
};

// The answer to GET `path` (starting with kPlansPath). `origin` names the
// daemon in the pages' headers. Thread-safe (PlanCache is).
HttpAnswer ServePlansPath(const plan::PlanCache& cache, absl::string_view path,
                          const std::string& origin);

}  // namespace hsap::viewer

#endif  // HSAP_SERVER_VIEWER_PLANS_HTTP_H_

#include "server/viewer/plans_http.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/viewer/page_text.h"
#include "server/viewer/plan_page.h"

namespace hsap::viewer {
namespace {

HttpAnswer Plain(int status, std::string body) {
  HttpAnswer a;
  a.status = status;
  a.content_type = "text/plain; charset=utf-8";
  a.body = std::move(body);
  return a;
}

}  // namespace

HttpAnswer ServePlansPath(const plan::PlanCache& cache, absl::string_view path,
                          const std::string& origin) {
  absl::string_view rest = path;
  if (!absl::ConsumePrefix(&rest, kPlansPath) || (!rest.empty() && rest[0] != '/')) {
    return Plain(404, "not found; plan pages are at /plans\n");
  }
  absl::ConsumePrefix(&rest, "/");
  if (rest.empty()) {
    std::vector<IndexEntry> entries;
    for (const plan::PlanCacheEntry& e : cache.List()) {
      IndexEntry row;
      row.entry = e;
      absl::StatusOr<std::shared_ptr<const plan::Plan>> p = cache.Show(e.key);
      if (p.ok()) {
        row.num_nodes = (*p)->spec.topology.num_nodes;
        row.devices_per_node = (*p)->spec.topology.devices_per_node;
        if (!(*p)->spec.cu_seqlens.empty()) {
          row.documents = static_cast<int64_t>((*p)->spec.cu_seqlens.size()) - 1;
        }
      }
      entries.push_back(row);
    }
    HttpAnswer a;
    // Relative links, so the pages work behind a proxy's path prefix: from
    // /plans, "plans/<key>"; from /plans/, "<key>".
    a.body = PlanIndexHtml(entries, cache.Stats(), origin,
                           path.size() > kPlansPath.size() ? "" : "plans/");
    return a;
  }
  plan::PlanKey key;
  if (!plan::PlanKey::FromHex(rest, &key)) {
    return Plain(400, absl::StrCat("plan key '", rest.substr(0, 40),
                                   "' is not 32 hex digits\n"));
  }
  absl::StatusOr<std::shared_ptr<const plan::Plan>> p = cache.Show(key);
  if (!p.ok()) {
    return Plain(404, absl::StrCat("plan ", key.ToHex(),
                                   " is not in the cache (evicted, or never compiled here)\n"));
  }
  int64_t hits = 0;
  for (const plan::PlanCacheEntry& e : cache.List()) {
    if (e.key == key) hits = e.hits;
  }
  HttpAnswer a;
  a.body = PlanPageHtml(**p, {.origin = origin, .cache_hits = hits, .index_link = "../plans"});
  return a;
}

}  // namespace hsap::viewer

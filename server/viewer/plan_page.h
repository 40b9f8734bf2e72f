// The plan viewer: one self-contained HTML page per compiled plan, and the
// plan cache's index page (docs/plan_viewer.md, "Plan cache inspection").
//
// A plan page is inline SVG, inline CSS and a little plain JavaScript
// (tooltips), with a Content-Security-Policy that allows nothing to be
// fetched: it opens from a file on a machine without a network. It shows
//   1. the header: key, strategy (for auto every candidate's modeled time),
//      profile, topology, T, heads, dtype, compile time, cache hits;
//   2. the layout strip: documents, the ranks and nodes holding each token;
//   3. load per rank: compute (area x heads), received bytes by link tier,
//      the mean and each rank's exact-need lower bound, the imbalance;
//   4. the traffic matrix, rank x rank and node x node, forward and
//      backward, inter-node cells in their own colours;
//   5. the stage timeline: each stage's modeled transfer and compute time,
//      forward and backward, with the modeled total and its floors.
// Above 64 ranks, rows are nodes (plan_figures.h, PageRows). The numbers
// are also embedded as JSON in <script type="application/json"
// id="plan-data"> (the fields are listed in plan_page.cc, AppendData). A
// script error shows in <pre id="errors">, which is otherwise empty. The
// page holds no tensor data: document boundaries, the assignment and the
// plan's statistics only.
//
// Pure functions: (plan, page info) -> HTML text; deterministic.
//
// Example:
//   HSAP_ASSIGN_OR_RETURN(plan::Plan plan, plan::CompilePlan(spec));
//   std::string html = PlanPageHtml(plan, {.origin = "hsapctl plan"});
#ifndef HSAP_SERVER_VIEWER_PLAN_PAGE_H_
#define HSAP_SERVER_VIEWER_PLAN_PAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/plan/plan.h"
#include "server/plan/plan_cache.h"

namespace hsap::viewer {

// What the page says about where the plan came from.
struct PageInfo {
  // Shown in the header, e.g. "hsapd, plan cache" or "hsapctl plan".
  std::string origin;
  // Cache hits of the plan; < 0: not from a cache (shown as "-").
  int64_t cache_hits = -1;
  // A link back to the index page ("../plans" when served); "" for none.
  std::string index_link;
};

std::string PlanPageHtml(const plan::Plan& plan, const PageInfo& info);

// One row of the index page: a cache entry and, when the plan is still
// cached, its topology and document count.
struct IndexEntry {
  plan::PlanCacheEntry entry;
  int32_t num_nodes = 0;  // 0: unknown
  int32_t devices_per_node = 0;
  int64_t documents = -1;  // -1: unknown (a slice mask, or evicted)
};

// The index page of a plan cache: its counters and one row per plan, most
// recently used first, each linking to `link_prefix` + key (e.g. "plans/").
std::string PlanIndexHtml(const std::vector<IndexEntry>& entries,
                          const plan::PlanCacheStats& stats, const std::string& origin,
                          const std::string& link_prefix);

}  // namespace hsap::viewer

#endif  // HSAP_SERVER_VIEWER_PLAN_PAGE_H_

// Internal to the plan page (plan_page.h): everything one page shows,
// computed once from the plan, and the functions that draw its figures as
// SVG (plan_svg.cc).
#ifndef HSAP_SERVER_VIEWER_PAGE_MODEL_H_
#define HSAP_SERVER_VIEWER_PAGE_MODEL_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "server/plan/cost_model.h"
#include "server/plan/plan.h"
#include "server/viewer/plan_figures.h"
#include "server/viewer/plan_page.h"

namespace hsap::viewer::internal {

// A page row's sums (ranks: its rank's figures; nodes: their ranks' sums,
// and the slowest rank's times).
struct RowLoad {
  int64_t tokens = 0;
  int64_t head_area = 0;
  std::array<int64_t, plan::kNumTiers> fwd_recv{};
  std::array<int64_t, plan::kNumTiers> bwd_recv{};
  int64_t lower_bound_recv_bytes = 0;
  double fwd_us = 0;  // the row's slowest rank
  double bwd_us = 0;
};

// A document of the layout strip: a document of cu_seqlens, or for a mask
// given as slices, a run of query rows whose slices overlap.
struct Document {
  int64_t begin = 0;
  int64_t end = 0;
};

struct PageModel {
  const plan::Plan* plan = nullptr;
  PageInfo info;
  bool profile_ok = false;
  plan::HardwareProfile profile;
  std::vector<TierSplit> tiers;  // per rank
  Floors floors;
  Rows rows;
  std::vector<RowLoad> loads;  // per row
  std::vector<Document> documents;
  std::vector<plan::OwnerSegment> owners;  // who holds each token
  // rows x rows; when rows are ranks and there are 2 to kMaxRows nodes,
  // also nodes x nodes.
  TrafficMatrix traffic;
  bool has_node_traffic = false;
  TrafficMatrix node_traffic;
  // Without a profile (timeline_error set) there is no timeline.
  std::string timeline_error;
  Timeline timeline;
  BinnedTimeline fwd_bins;
  BinnedTimeline bwd_bins;
};

PageModel BuildModel(const plan::Plan& plan, const PageInfo& info);

// The SVG figures (plan_svg.cc), each an <svg> element appended to `out`.
void AppendLayoutSvg(const PageModel& m, std::string* out);
void AppendLoadSvg(const PageModel& m, std::string* out);
void AppendTrafficSvg(const PageModel& m, std::string* out);
void AppendTimelineSvg(const PageModel& m, bool backward, std::string* out);

// The label of the imbalance figure, "imbalance 1.0296" (tests look for it).
std::string ImbalanceLabel(double imbalance);

// The page's script (plan_page_script.cc): tooltips and hover read-outs
// from the JSON data block, and errors into <pre id="errors">.
extern const char kPageScript[];
// Runs first: reports script errors into <pre id="errors">.
extern const char kErrorScript[];

}  // namespace hsap::viewer::internal

#endif  // HSAP_SERVER_VIEWER_PAGE_MODEL_H_

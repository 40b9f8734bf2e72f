#include <algorithm>

#include "absl/strings/str_format.h"
#include "server/plan/dispatch.h"
#include "server/viewer/page_model.h"

namespace hsap::viewer::internal {
namespace {

// Timelines show at most this many stage columns (more are merged in runs).
constexpr int32_t kMaxStageBins = 96;

std::vector<Document> DocumentsOf(const plan::PlanSpec& spec) {
  std::vector<Document> docs;
  if (!spec.cu_seqlens.empty()) {
    for (size_t i = 0; i + 1 < spec.cu_seqlens.size(); ++i) {
      docs.push_back({spec.cu_seqlens[i], spec.cu_seqlens[i + 1]});
    }
    return docs;
  }
  std::vector<MaskSlice> slices = plan::ResolveSlices(spec);
  std::sort(slices.begin(), slices.end(), [](const MaskSlice& a, const MaskSlice& b) {
    return a.q_begin < b.q_begin;
  });
  for (const MaskSlice& s : slices) {
    if (!docs.empty() && s.q_begin < docs.back().end) {
      docs.back().end = std::max(docs.back().end, s.q_end);
    } else {
      docs.push_back({s.q_begin, s.q_end});
    }
  }
  return docs;
}

}  // namespace

std::string ImbalanceLabel(double imbalance) {
  return absl::StrFormat("imbalance %.4f", imbalance);
}

PageModel BuildModel(const plan::Plan& plan, const PageInfo& info) {
  PageModel m;
  m.plan = &plan;
  m.info = info;
  absl::StatusOr<plan::HardwareProfile> profile = plan::ParseHardwareProfile(plan.spec.profile);
  m.profile_ok = profile.ok();
  if (profile.ok()) m.profile = *profile;
  m.tiers = ReceivedBytesByTier(plan);
  m.floors = ComputeFloors(plan);
  m.rows = PageRows(plan.spec.topology);
  m.documents = DocumentsOf(plan.spec);
  m.owners = plan::BuildOwnerMap(plan.dispatch);

  m.loads.resize(m.rows.rows.size());
  for (size_t i = 0; i < m.rows.rows.size(); ++i) {
    const Row& row = m.rows.rows[i];
    RowLoad& load = m.loads[i];
    for (int32_t r = row.first_rank; r <= row.last_rank && r < (int32_t)plan.ranks.size(); ++r) {
      const plan::RankStats& s = plan.ranks[r].stats;
      load.tokens += s.tokens;
      load.head_area += s.head_area;
      for (int t = 0; t < plan::kNumTiers; ++t) {
        load.fwd_recv[t] += m.tiers[r].fwd[t];
        load.bwd_recv[t] += m.tiers[r].bwd[t];
      }
      load.lower_bound_recv_bytes += s.lower_bound_recv_bytes;
      load.fwd_us = std::max(load.fwd_us, s.fwd_us);
      load.bwd_us = std::max(load.bwd_us, s.bwd_us);
    }
  }

  const plan::Topology& topo = plan.spec.topology;
  if (m.rows.level == RowLevel::kRank) {
    m.traffic = RankTraffic(plan);
    if (topo.num_nodes > 1) {
      m.has_node_traffic = true;
      m.node_traffic = NodeTraffic(plan);
    }
  } else {
    m.traffic = GroupTraffic(NodeTraffic(plan), m.rows, /*from_nodes=*/true);
  }

  absl::StatusOr<Timeline> timeline = ModelTimeline(plan);
  if (timeline.ok()) {
    m.timeline = *std::move(timeline);
    m.fwd_bins = BinTimeline(m.timeline.fwd, m.timeline.fwd_stage_us, m.rows, kMaxStageBins);
    m.bwd_bins = BinTimeline(m.timeline.bwd, m.timeline.bwd_stage_us, m.rows, kMaxStageBins);
  } else {
    m.timeline_error = std::string(timeline.status().message());
  }
  return m;
}

}  // namespace hsap::viewer::internal

#include "server/viewer/plan_figures.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/plan/cost_model.h"
#include "server/plan/demand.h"
#include "server/plan/dispatch.h"

namespace hsap::viewer {
namespace {

using plan::LinkTier;
using plan::Plan;
using plan::RankPlan;
using plan::Stage;
using plan::Transfer;
using plan::TransferList;

constexpr int kIntra = static_cast<int>(LinkTier::kIntraNode);
constexpr int kInter = static_cast<int>(LinkTier::kInterNode);

int TierOf(const plan::Topology& topology, int32_t a, int32_t b) {
  return topology.NodeOf(a) == topology.NodeOf(b) ? kIntra : kInter;
}

// Bytes of one stage's lists by tier, as the cost model counts them.
struct StageTierBytes {
  std::array<int64_t, plan::kNumTiers> send{}, recv{}, return_send{}, return_recv{};
};

void AddBytes(const plan::Topology& topo, int32_t rank, const TransferList& list,
              std::array<int64_t, plan::kNumTiers>* out) {
  for (const Transfer& t : list) (*out)[TierOf(topo, rank, t.peer)] += t.bytes;
}

StageTierBytes BytesOf(const plan::Topology& topo, int32_t rank, const Stage& st) {
  StageTierBytes b;
  AddBytes(topo, rank, st.sends, &b.send);
  AddBytes(topo, rank, st.recvs, &b.recv);
  AddBytes(topo, rank, st.return_sends, &b.return_send);
  AddBytes(topo, rank, st.return_recvs, &b.return_recv);
  return b;
}

// cost_model.cc's per-tier transfer term: each tier the larger of what is
// sent and received, plus its latency when it moves anything; tiers in
// parallel. Returns the slowest tier's seconds and sets *tier to it.
double TransferSeconds(const plan::HardwareProfile& p, const std::array<int64_t, 2>& send,
                       const std::array<int64_t, 2>& recv, LinkTier* tier) {
  const double bw[plan::kNumTiers] = {p.intra_bytes_per_s,
                                      p.inter_bytes_per_s * std::max(1.0, p.inter_link_ranks)};
  const double lat[plan::kNumTiers] = {p.intra_latency_s, p.inter_latency_s};
  double worst = 0;
  for (int t = 0; t < plan::kNumTiers; ++t) {
    const int64_t bytes = std::max(send[t], recv[t]);
    const double s = bytes > 0 ? lat[t] + static_cast<double>(bytes) / bw[t] : 0.0;
    if (s > worst) {
      worst = s;
      if (tier != nullptr) *tier = static_cast<LinkTier>(t);
    }
  }
  return worst;
}

// cost_model.cc's compute term.
double ComputeSeconds(const plan::HardwareProfile& p, int64_t area, int64_t heads,
                      int64_t kv_heads, int64_t head_dim, bool backward) {
  const double flops = 4.0 * static_cast<double>(area) * heads * head_dim *
                       (backward ? p.backward_factor : 1.0);
  const double interleave =
      kv_heads > 1 && p.kv_interleave_factor < 1
          ? std::pow(p.kv_interleave_factor, std::log2(static_cast<double>(kv_heads)))
          : 1.0;
  return flops / (p.attention_flops * interleave);
}

// With inter-node links shared by k > 1 ranks (HardwareProfile::
// inter_link_ranks) the model charges each rank its link's inter-node
// bytes: the sums over the link's ranks (a node's ranks in rank order, k to
// a link). Replaces the inter-node entries of bytes[rank][stage].
void UseLinkBytes(const Plan& plan, int32_t k, std::vector<std::vector<StageTierBytes>>* bytes) {
  const size_t P = plan.ranks.size();
  std::map<int32_t, int32_t> seen_on_node;
  std::vector<int64_t> link(P);
  for (size_t r = 0; r < P; ++r) {
    const int32_t node = plan.ranks[r].node;
    const int32_t index = seen_on_node[node]++;
    link[r] = (static_cast<int64_t>(node) << 32) | (index / k);
  }
  std::map<int64_t, std::vector<StageTierBytes>> sums;
  for (size_t r = 0; r < P; ++r) {
    std::vector<StageTierBytes>& sum = sums[link[r]];
    const std::vector<StageTierBytes>& own = (*bytes)[r];
    if (sum.size() < own.size()) sum.resize(own.size());
    for (size_t s = 0; s < own.size(); ++s) {
      sum[s].send[kInter] += own[s].send[kInter];
      sum[s].recv[kInter] += own[s].recv[kInter];
      sum[s].return_send[kInter] += own[s].return_send[kInter];
      sum[s].return_recv[kInter] += own[s].return_recv[kInter];
    }
  }
  for (size_t r = 0; r < P; ++r) {
    const std::vector<StageTierBytes>& sum = sums[link[r]];
    for (size_t s = 0; s < (*bytes)[r].size(); ++s) {
      StageTierBytes& b = (*bytes)[r][s];
      b.send[kInter] = sum[s].send[kInter];
      b.recv[kInter] = sum[s].recv[kInter];
      b.return_send[kInter] = sum[s].return_send[kInter];
      b.return_recv[kInter] = sum[s].return_recv[kInter];
    }
  }
}

std::vector<double> SlowestPerStage(const std::vector<std::vector<StageTime>>& per_rank) {
  std::vector<double> out;
  for (const auto& stages : per_rank) {
    if (out.size() < stages.size()) out.resize(stages.size(), 0.0);
    for (size_t s = 0; s < stages.size(); ++s) out[s] = std::max(out[s], stages[s].total_us());
  }
  return out;
}

}  // namespace

double StageTime::total_us() const {
  return std::max(transfer_us, overlap_us) + compute_us + std::max(return_us, return_overlap_us);
}

std::vector<TierSplit> ReceivedBytesByTier(const Plan& plan) {
  const plan::Topology& topo = plan.spec.topology;
  std::vector<TierSplit> out(plan.ranks.size());
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    const RankPlan& rp = plan.ranks[r];
    for (const Stage& st : rp.forward) AddBytes(topo, rp.rank, st.recvs, &out[r].fwd);
    for (const Stage& st : rp.backward) {
      AddBytes(topo, rp.rank, st.recvs, &out[r].bwd);
      AddBytes(topo, rp.rank, st.return_recvs, &out[r].bwd);
    }
  }
  return out;
}

namespace {

TrafficMatrix Traffic(const Plan& plan, bool nodes) {
  const plan::Topology& topo = plan.spec.topology;
  TrafficMatrix m;
  m.size = nodes ? topo.num_nodes : static_cast<int32_t>(plan.ranks.size());
  m.fwd.assign(static_cast<size_t>(m.size) * m.size, 0);
  m.bwd.assign(m.fwd.size(), 0);
  auto unit = [&](int32_t rank) { return nodes ? topo.NodeOf(rank) : rank; };
  auto add = [&](const TransferList& recvs, int32_t dst, std::vector<int64_t>* out) {
    for (const Transfer& t : recvs) {
      (*out)[static_cast<size_t>(unit(t.peer)) * m.size + unit(dst)] += t.bytes;
    }
  };
  for (const RankPlan& rp : plan.ranks) {
    for (const Stage& st : rp.forward) add(st.recvs, rp.rank, &m.fwd);
    for (const Stage& st : rp.backward) {
      add(st.recvs, rp.rank, &m.bwd);
      add(st.return_recvs, rp.rank, &m.bwd);
    }
  }
  return m;
}

}  // namespace

TrafficMatrix RankTraffic(const Plan& plan) { return Traffic(plan, false); }
TrafficMatrix NodeTraffic(const Plan& plan) { return Traffic(plan, true); }

absl::StatusOr<Timeline> ModelTimeline(const Plan& plan) {
  absl::StatusOr<plan::HardwareProfile> parsed = plan::ParseHardwareProfile(plan.spec.profile);
  if (!parsed.ok()) return parsed.status();
  const plan::HardwareProfile& profile = *parsed;
  const plan::Topology& topo = plan.spec.topology;
  const int64_t D = plan.spec.shape.head_dim;
  const size_t P = plan.ranks.size();
  std::vector<std::vector<StageTierBytes>> fwd_bytes(P), bwd_bytes(P);
  for (size_t r = 0; r < P; ++r) {
    const RankPlan& rp = plan.ranks[r];
    for (const Stage& st : rp.forward) fwd_bytes[r].push_back(BytesOf(topo, rp.rank, st));
    for (const Stage& st : rp.backward) bwd_bytes[r].push_back(BytesOf(topo, rp.rank, st));
  }
  const int32_t k = static_cast<int32_t>(std::max(1.0, profile.inter_link_ranks));
  if (k > 1) {
    UseLinkBytes(plan, k, &fwd_bytes);
    UseLinkBytes(plan, k, &bwd_bytes);
  }
  Timeline tl;
  tl.fwd.resize(P);
  tl.bwd.resize(P);
  for (size_t r = 0; r < P; ++r) {
    const RankPlan& rp = plan.ranks[r];
    const int64_t heads = rp.q_head_end - rp.q_head_begin;
    const int64_t kv_heads = rp.kv_head_end - rp.kv_head_begin;
    for (int backward = 0; backward < 2; ++backward) {
      const std::vector<Stage>& stages = backward ? rp.backward : rp.forward;
      const std::vector<StageTierBytes>& bytes = backward ? bwd_bytes[r] : fwd_bytes[r];
      std::vector<StageTime>& out = backward ? tl.bwd[r] : tl.fwd[r];
      for (size_t s = 0; s < stages.size(); ++s) {
        StageTime t;
        t.transfer_us =
            TransferSeconds(profile, bytes[s].send, bytes[s].recv, &t.transfer_tier) * 1e6;
        t.overlap_us = ComputeSeconds(profile, plan::ItemsArea(stages[s].overlap_items), heads,
                                      kv_heads, D, backward) * 1e6;
        t.compute_us =
            ComputeSeconds(profile, plan::ItemsArea(stages[s].items), heads, kv_heads, D, backward) *
            1e6;
        if (backward) {
          t.return_us =
              TransferSeconds(profile, bytes[s].return_send, bytes[s].return_recv, nullptr) * 1e6;
          t.return_overlap_us = ComputeSeconds(profile, plan::ItemsArea(stages[s].return_overlap_items),
                                               heads, kv_heads, D, true) * 1e6;
        }
        out.push_back(t);
      }
    }
  }
  tl.fwd_stage_us = SlowestPerStage(tl.fwd);
  tl.bwd_stage_us = SlowestPerStage(tl.bwd);
  return tl;
}

std::vector<int64_t> InterNodeExactNeedBytes(const Plan& plan) {
  const plan::Topology& topo = plan.spec.topology;
  const std::vector<MaskSlice> slices = plan::ResolveSlices(plan.spec);
  const plan::SliceIndex index(slices);
  const int64_t kappa = plan::KvRowBytes(plan.spec.shape, plan.spec.shape.num_heads_kv);
  std::vector<int64_t> out = plan::NodeInterNeedTokens(index, plan.dispatch, topo);
  for (int64_t& b : out) b *= kappa;
  return out;
}

Floors ComputeFloors(const Plan& plan) {
  Floors f;
  for (const RankPlan& rp : plan.ranks) {
    f.fwd_compute_us = std::max(f.fwd_compute_us, rp.stats.fwd_compute_us);
    f.bwd_compute_us = std::max(f.bwd_compute_us, rp.stats.bwd_compute_us);
  }
  f.node_inter_need_bytes = InterNodeExactNeedBytes(plan);
  f.plan_lower_bound_us = plan.stats.lower_bound_us;
  absl::StatusOr<plan::HardwareProfile> profile = plan::ParseHardwareProfile(plan.spec.profile);
  if (profile.ok() && plan.spec.topology.num_nodes > 1 && profile->inter_bytes_per_s > 0) {
    const int64_t busiest =
        *std::max_element(f.node_inter_need_bytes.begin(), f.node_inter_need_bytes.end());
    const double node_bw = profile->inter_bytes_per_s * plan.spec.topology.devices_per_node;
    f.inter_need_us = static_cast<double>(busiest) / node_bw * 1e6;
  }
  return f;
}

Rows PageRows(const plan::Topology& topology) {
  Rows out;
  const int32_t P = topology.num_ranks(), N = topology.num_nodes, dpn = topology.devices_per_node;
  if (P <= kMaxRows) {
    out.level = RowLevel::kRank;
    for (int32_t r = 0; r < P; ++r) {
      out.rows.push_back({r, r, topology.NodeOf(r), topology.NodeOf(r), absl::StrCat("rank ", r)});
    }
    return out;
  }
  const int32_t per_row = (N + kMaxRows - 1) / kMaxRows;
  out.level = per_row == 1 ? RowLevel::kNode : RowLevel::kNodeRun;
  for (int32_t n = 0; n < N; n += per_row) {
    const int32_t last = std::min(N, n + per_row) - 1;
    out.rows.push_back({n * dpn, (last + 1) * dpn - 1, n, last,
                        per_row == 1 ? absl::StrCat("node ", n)
                                     : absl::StrCat("nodes ", n, "-", last)});
  }
  return out;
}

TrafficMatrix GroupTraffic(const TrafficMatrix& matrix, const Rows& rows, bool from_nodes) {
  TrafficMatrix out;
  out.size = static_cast<int32_t>(rows.rows.size());
  out.fwd.assign(static_cast<size_t>(out.size) * out.size, 0);
  out.bwd.assign(out.fwd.size(), 0);
  std::vector<int32_t> row_of(matrix.size, 0);
  for (int32_t i = 0; i < out.size; ++i) {
    const Row& row = rows.rows[i];
    const int32_t first = from_nodes ? row.first_node : row.first_rank;
    const int32_t last = from_nodes ? row.last_node : row.last_rank;
    for (int32_t u = first; u <= last && u < matrix.size; ++u) row_of[u] = i;
  }
  for (int32_t a = 0; a < matrix.size; ++a) {
    for (int32_t b = 0; b < matrix.size; ++b) {
      const size_t from = static_cast<size_t>(a) * matrix.size + b;
      const size_t to = static_cast<size_t>(row_of[a]) * out.size + row_of[b];
      out.fwd[to] += matrix.fwd[from];
      out.bwd[to] += matrix.bwd[from];
    }
  }
  return out;
}

BinnedTimeline BinTimeline(const std::vector<std::vector<StageTime>>& per_rank,
                           const std::vector<double>& stage_us, const Rows& rows,
                           int32_t max_bins) {
  BinnedTimeline out;
  out.num_stages = static_cast<int32_t>(stage_us.size());
  out.stages_per_bin =
      std::max<int32_t>(1, (out.num_stages + std::max(1, max_bins) - 1) / std::max(1, max_bins));
  const int32_t bins = (out.num_stages + out.stages_per_bin - 1) / out.stages_per_bin;
  double t = 0;
  for (int32_t b = 0; b < bins; ++b) {
    out.bin_start_us.push_back(t);
    double sum = 0;
    for (int32_t s = b * out.stages_per_bin;
         s < std::min(out.num_stages, (b + 1) * out.stages_per_bin); ++s) {
      sum += stage_us[s];
    }
    out.bin_us.push_back(sum);
    t += sum;
  }
  out.cells.assign(rows.rows.size(), std::vector<std::array<double, 6>>(bins));
  for (size_t i = 0; i < rows.rows.size(); ++i) {
    const Row& row = rows.rows[i];
    for (int32_t b = 0; b < bins; ++b) {
      double inter_us = 0;
      std::array<double, 6>& cell = out.cells[i][b];
      for (int32_t s = b * out.stages_per_bin;
           s < std::min(out.num_stages, (b + 1) * out.stages_per_bin); ++s) {
        StageTime worst;
        for (int32_t r = row.first_rank; r <= row.last_rank && r < (int32_t)per_rank.size();
             ++r) {
          if (s >= static_cast<int32_t>(per_rank[r].size())) continue;
          const StageTime& st = per_rank[r][s];
          if (st.transfer_us > worst.transfer_us) {
            worst.transfer_us = st.transfer_us;
            worst.transfer_tier = st.transfer_tier;
          }
          worst.overlap_us = std::max(worst.overlap_us, st.overlap_us);
          worst.compute_us = std::max(worst.compute_us, st.compute_us);
          worst.return_us = std::max(worst.return_us, st.return_us);
          worst.return_overlap_us = std::max(worst.return_overlap_us, st.return_overlap_us);
        }
        cell[0] += worst.transfer_us;
        cell[1] += worst.overlap_us;
        cell[2] += worst.compute_us;
        cell[3] += worst.return_us;
        cell[5] += worst.return_overlap_us;
        if (worst.transfer_tier == LinkTier::kInterNode) inter_us += worst.transfer_us;
      }
      cell[4] = cell[0] > 0 ? inter_us / cell[0] : 0;
    }
  }
  return out;
}

}  // namespace hsap::viewer

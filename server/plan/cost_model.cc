#include "server/plan/cost_model.h"

#include <algorithm>

#include "server/plan/parallel.h"
#include "server/plan/plan.h"

namespace hsap::plan {
namespace {

// Sources (orientation, not promises):
//  * H100/H200 SXM: NVLink 4 = 900 GB/s bidirectional per GPU, ~360 GB/s
//    achieved one way by NCCL point-to-point; one 400 Gb/s NDR InfiniBand NIC
//    per GPU, ~45 GB/s achieved; FlashAttention-3 bf16 forward reaches
//    500-700 TFLOP/s on H100, ~400 TFLOP/s averaged over causal and short
//    documents; H200 has the same links and ~10% more attention throughput
//    from its faster HBM.
//  * cpu-loopback: this project's 2-core CI machine (BUILD_NOTES.md): UCX
//    posix shared memory ~6 GB/s between processes of one host, UCX tcp over
//    loopback ~2.7 GB/s, fp32 attention ~50 GFLOP/s per rank.
const std::vector<HardwareProfile>& Profiles() {
  static const auto* profiles = new std::vector<HardwareProfile>{
      {"h100", "H100 SXM cluster: NVLink inside a node, 400G InfiniBand per GPU, bf16",
       360e9, 45e9, 8e-6, 15e-6, 400e12, 2.5},
      {"h200", "H200 SXM cluster: NVLink inside a node, 400G InfiniBand per GPU, bf16",
       360e9, 45e9, 8e-6, 15e-6, 440e12, 2.5},
      {"cpu-loopback", "2-core CPU host: shared memory inside a node, TCP loopback across",
       6e9, 2.7e9, 20e-6, 50e-6, 50e9, 2.5},
  };
  return *profiles;
}

struct TierBytes {
  std::array<int64_t, kNumTiers> send{};
  std::array<int64_t, kNumTiers> recv{};
};

void Add(const TransferList& ts, bool recv, TierBytes* b) {
  for (const Transfer& t : ts) {
    (recv ? b->recv : b->send)[static_cast<int>(t.tier)] += t.bytes;
  }
}

// Seconds to move `b`: tiers in parallel; each tier limited by the larger of
// what the rank sends and receives on it.
double TransferSeconds(const HardwareProfile& p, const TierBytes& b,
                       std::array<double, kNumTiers>* per_tier) {
  double worst = 0;
  const double bw[kNumTiers] = {p.intra_bytes_per_s, p.inter_bytes_per_s};
  const double lat[kNumTiers] = {p.intra_latency_s, p.inter_latency_s};
  for (int t = 0; t < kNumTiers; ++t) {
    const int64_t bytes = std::max(b.send[t], b.recv[t]);
    const double s = bytes > 0 ? lat[t] + static_cast<double>(bytes) / bw[t] : 0.0;
    if (per_tier != nullptr) (*per_tier)[t] += s;
    worst = std::max(worst, s);
  }
  return worst;
}

int64_t ItemsArea(const SharedList<WorkItem>& items) {
  int64_t area = 0;
  for (const WorkItem& w : items) {
    MaskSlice s;
    s.q_end = w.num_q;
    s.k_end = w.num_k;
    s.type = w.type;
    s.offset = w.offset;
    s.window = w.window;
    area += SliceArea(s);
  }
  return area;
}

double ComputeSeconds(const HardwareProfile& p, int64_t area, int64_t heads, int64_t head_dim,
                      bool backward) {
  const double flops = 4.0 * static_cast<double>(area) * heads * head_dim *
                       (backward ? p.backward_factor : 1.0);
  return flops / p.attention_flops;
}

// area(rank index, stage index, overlap?) -> area of that stage's items.
// Each rank is modeled on its own (over the pool), then the slowest rank of
// each stage and the bounds are reduced in rank order.
template <typename AreaFn>
void Model(const HardwareProfile& profile, AreaFn&& area, Plan* plan, ThreadPool* pool) {
  const int64_t D = plan->spec.shape.head_dim;
  size_t fwd_stages = 0, bwd_stages = 0;
  for (const RankPlan& rp : plan->ranks) {
    fwd_stages = std::max(fwd_stages, rp.forward.size());
    bwd_stages = std::max(bwd_stages, rp.backward.size());
  }
  struct RankTimes {
    std::vector<double> fwd, bwd;  // per stage, seconds
    double lb_fwd = 0, lb_bwd = 0;
  };
  std::vector<RankTimes> times(plan->ranks.size());
  internal::ForEachIndex(pool, static_cast<int64_t>(plan->ranks.size()), [&](int64_t r) {
    const size_t ri = static_cast<size_t>(r);
    RankPlan& rp = plan->ranks[ri];
    RankTimes& rt = times[ri];
    rt.fwd.assign(rp.forward.size(), 0.0);
    rt.bwd.assign(rp.backward.size(), 0.0);
    RankStats& rs = rp.stats;
    const int64_t heads = rp.q_head_end - rp.q_head_begin;
    rs.fwd_compute_us = rs.bwd_compute_us = rs.fwd_us = rs.bwd_us = 0;
    rs.fwd_transfer_us = {};
    rs.bwd_transfer_us = {};
    TierBytes fwd_total, bwd_total;
    for (size_t s = 0; s < rp.forward.size(); ++s) {
      const Stage& st = rp.forward[s];
      TierBytes b;
      Add(st.sends, false, &b);
      Add(st.recvs, true, &b);
      for (int t = 0; t < kNumTiers; ++t) {
        fwd_total.send[t] += b.send[t];
        fwd_total.recv[t] += b.recv[t];
      }
      const double xfer = TransferSeconds(profile, b, &rs.fwd_transfer_us);
      const double overlap =
          ComputeSeconds(profile, area(ri, s, false, true), heads, D, false);
      const double after = ComputeSeconds(profile, area(ri, s, false, false), heads, D, false);
      const double t = std::max(xfer, overlap) + after;
      rs.fwd_compute_us += (overlap + after) * 1e6;
      rs.fwd_us += t * 1e6;
      rt.fwd[s] = t;
    }
    for (size_t s = 0; s < rp.backward.size(); ++s) {
      const Stage& st = rp.backward[s];
      TierBytes b, r;
      Add(st.sends, false, &b);
      Add(st.recvs, true, &b);
      Add(st.return_sends, false, &r);
      Add(st.return_recvs, true, &r);
      for (const TierBytes* x : {&b, &r}) {
        for (int t = 0; t < kNumTiers; ++t) {
          bwd_total.send[t] += x->send[t];
          bwd_total.recv[t] += x->recv[t];
        }
      }
      const double xfer = TransferSeconds(profile, b, &rs.bwd_transfer_us);
      const double ret = TransferSeconds(profile, r, &rs.bwd_transfer_us);
      const double overlap = ComputeSeconds(profile, area(ri, s, true, true), heads, D, true);
      const double after = ComputeSeconds(profile, area(ri, s, true, false), heads, D, true);
      const double t = std::max(xfer, overlap) + after + ret;
      rs.bwd_compute_us += (overlap + after) * 1e6;
      rs.bwd_us += t * 1e6;
      rt.bwd[s] = t;
    }
    for (int t = 0; t < kNumTiers; ++t) {
      rs.fwd_transfer_us[t] *= 1e6;
      rs.bwd_transfer_us[t] *= 1e6;
    }
    const double bw[kNumTiers] = {profile.intra_bytes_per_s, profile.inter_bytes_per_s};
    double fwd_bytes_s = 0, bwd_bytes_s = 0;
    for (int t = 0; t < kNumTiers; ++t) {
      fwd_bytes_s = std::max(fwd_bytes_s,
                             std::max(fwd_total.send[t], fwd_total.recv[t]) / bw[t]);
      bwd_bytes_s = std::max(bwd_bytes_s,
                             std::max(bwd_total.send[t], bwd_total.recv[t]) / bw[t]);
    }
    rt.lb_fwd = std::max(rs.fwd_compute_us * 1e-6, fwd_bytes_s);
    rt.lb_bwd = std::max(rs.bwd_compute_us * 1e-6, bwd_bytes_s);
  });
  std::vector<double> fwd_max(fwd_stages, 0.0), bwd_max(bwd_stages, 0.0);
  double lb_fwd = 0, lb_bwd = 0;
  for (const RankTimes& rt : times) {
    for (size_t s = 0; s < rt.fwd.size(); ++s) fwd_max[s] = std::max(fwd_max[s], rt.fwd[s]);
    for (size_t s = 0; s < rt.bwd.size(); ++s) bwd_max[s] = std::max(bwd_max[s], rt.bwd[s]);
    lb_fwd = std::max(lb_fwd, rt.lb_fwd);
    lb_bwd = std::max(lb_bwd, rt.lb_bwd);
  }
  PlanStats& ps = plan->stats;
  ps.fwd_us = ps.bwd_us = 0;
  for (double t : fwd_max) ps.fwd_us += t * 1e6;
  for (double t : bwd_max) ps.bwd_us += t * 1e6;
  ps.modeled_us = ps.fwd_us + ps.bwd_us;
  ps.lower_bound_us = (lb_fwd + lb_bwd) * 1e6;
}

}  // namespace

std::vector<std::string> HardwareProfileNames() {
  std::vector<std::string> names;
  for (const HardwareProfile& p : Profiles()) names.push_back(p.name);
  return names;
}

bool IsKnownProfile(absl::string_view name) {
  for (const HardwareProfile& p : Profiles()) {
    if (p.name == name) return true;
  }
  return false;
}

const HardwareProfile& GetHardwareProfile(absl::string_view name) {
  for (const HardwareProfile& p : Profiles()) {
    if (p.name == name) return p;
  }
  return Profiles().front();
}

void ModelPlanTime(const HardwareProfile& profile, Plan* plan) {
  Model(
      profile,
      [plan](size_t r, size_t s, bool backward, bool overlap) {
        const Stage& st = (backward ? plan->ranks[r].backward : plan->ranks[r].forward)[s];
        return ItemsArea(overlap ? st.overlap_items : st.items);
      },
      plan, nullptr);
}

void ModelPlanTimeWithAreas(const HardwareProfile& profile,
                            const std::vector<std::vector<std::array<int64_t, 2>>>& stage_area,
                            Plan* plan, ThreadPool* pool) {
  Model(
      profile,
      [&stage_area](size_t r, size_t s, bool, bool overlap) {
        return stage_area[r][s][overlap ? 0 : 1];
      },
      plan, pool);
}

}  // namespace hsap::plan

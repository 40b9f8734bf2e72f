// auto: the strategy with the lowest modeled time, by branch and bound over
// lower bounds of the candidates' modeled times (docs/planner.md,
// "Strategies").
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <utility>

#include "common/status_macros.h"
#include "server/plan/build_plan.h"
#include "server/plan/parallel.h"

namespace hsap::plan::internal {
namespace {

// Lower bounds of a strategy's modeled time without building its plan, for
// `auto` (branch and bound). ModelPlanTime sums, per phase, the slowest
// rank's time of each stage, so a phase takes at least any one rank's sum
// over its stages. A forward stage takes max(xfer, overlap) + after, so the
// sum is at least max(sum of xfer, compute); a backward stage takes
// max(xfer, A) + after + max(returns, B), with A + B its home items (some
// held back to compute under the returns), which is at least
// max(xfer + returns, A + B) + after: the sum is at least
// max(sum of xfer + sum of returns, 2.5 compute). A transfer term takes at
// least max(send, recv) bytes / bandwidth in each tier, and summed over
// stages at least max(total send, total recv) / bandwidth per tier. Hence,
// with a rank's totals in closed form:
//   fwd >= max over ranks of max(compute, X_fwd)
//   bwd >= max over ranks of max(2.5 compute, X_bwd + X_returns)
// (X_returns = R X_kv: the returns carry fp32 partials, R = ReturnBytesRatio)
// and, additively (sum of maxima >= maximum of sums; head stages have no
// work items; every item on the rank's own keys runs during its stage's
// transfers or returns, every other item after its stage's transfers):
//   fwd >= H_fwd + max(X_kv, own) + (compute - own)
//   bwd >= H_bwd + max((1 + R) X_kv, 2.5 own) + 2.5 (compute - own)
// with H the head stages' transfer terms, X_kv the K/V transfer term
// (returns mirror it) and `own` the compute on the group's own keys. The
// additive form is what excludes usp at 1M tokens and 512 ranks: its ring
// computes most of its area after each round's transfer.
// Compute is the mask area of the rank's home rows times its heads (work
// items cover every allowed pair of those rows exactly once); the bytes are
// those of the strategy's transfers: ring, allgather, usp move every other
// group's rows, sap and hsap the exact need, head stages the all-to-all
// volumes of HeadStage; backward returns mirror the K/V transfers.
struct BoundInputs {
  std::vector<int64_t> tokens;       // per rank
  std::vector<int64_t> area;         // per rank: mask area of its own rows
  std::vector<OwnerSegment> owners;  // BuildOwnerMap(dispatch)
  // Per head group size U, per group: the area of its rows against its own
  // keys (the overlap items'); strategies with the same U share it.
  std::map<int32_t, std::vector<int64_t>> own_area;
};

int64_t RowsArea(const SliceIndex& index, int64_t begin, int64_t end) {
  int64_t a = 0;
  const auto slices = index.slices();
  index.ForEachOverlapping(begin, end, [&](size_t i) {
    a += SliceArea(ClipRows(slices[i], begin, end));
  });
  return a;
}

// The allowed pairs of rows in `runs` against keys in `runs` (sorted,
// disjoint global runs).
int64_t OwnArea(const SliceIndex& index, const std::vector<TokenRange>& runs) {
  const auto slices = index.slices();
  int64_t area = 0;
  for (const TokenRange& q : runs) {
    index.ForEachOverlapping(q.begin, q.end, [&](size_t i) {
      const MaskSlice rows = ClipRows(slices[i], q.begin, q.end);
      const TokenRange keys = KeysSeen(rows);
      if (keys.empty()) return;
      auto it = std::upper_bound(runs.begin(), runs.end(), keys.begin,
                                 [](int64_t x, const TokenRange& r) { return x < r.end; });
      for (; it != runs.end() && it->begin < keys.end; ++it) {
        const int64_t a = std::max(keys.begin, it->begin), b = std::min(keys.end, it->end);
        if (a < b) area += SliceArea(SubSlice(rows, rows.q_begin, rows.q_end, a, b));
      }
    });
  }
  return area;
}

double ModeledLowerBoundUs(const PlanSpec& spec, const SliceIndex& index,
                           const Dispatch& dispatch, const BoundInputs& in, Strategy strategy,
                           const HardwareProfile& profile, ThreadPool* pool) {
  const Topology& topo = spec.topology;
  const int32_t P = topo.num_ranks();
  const int32_t U = HeadGroupSize(strategy, topo);
  const int32_t V = P / U;
  const int64_t D = spec.shape.head_dim;
  // A shared inter-node link (inter_link_ranks k) gives one rank up to k
  // times its share; the link's bytes are at least the rank's, so the
  // rank's bytes at the link's rate bound the model's term from below.
  const double bw[kNumTiers] = {profile.intra_bytes_per_s,
                                profile.inter_bytes_per_s * std::max(1.0, profile.inter_link_ranks)};
  const double ratio = static_cast<double>(ReturnBytesRatio(spec.shape.dtype));
  std::vector<int64_t> group_tokens(V, 0), group_area(V, 0);
  for (int32_t r = 0; r < P; ++r) {
    group_tokens[r / U] += in.tokens[r];
    group_area[r / U] += in.area[r];
  }
  const std::vector<int64_t>& own_area = in.own_area.at(U);
  std::vector<HeadSlot> slots(U);
  for (int32_t u = 0; u < U; ++u) slots[u] = HeadSlotOf(spec.shape, U, u);
  // Per rank and tier: K/V bytes sent and received (forward; the backward
  // repeats them and returns R times as many dK/dV bytes), head all-to-all bytes.
  using Tiers = std::array<int64_t, kNumTiers>;
  std::vector<Tiers> kv_send(P, Tiers{}), kv_recv(P, Tiers{});
  std::vector<Tiers> hf_send(P, Tiers{}), hf_recv(P, Tiers{}), hb_send(P, Tiers{}),
      hb_recv(P, Tiers{});
  // K/V bytes of one row per slot (0: a slot without heads) and each
  // rank's node.
  std::vector<int64_t> kappa(U, 0);
  for (int32_t u = 0; u < U; ++u) {
    if (slots[u].num_q() > 0) kappa[u] = KvRowBytes(spec.shape, slots[u].num_kv());
  }
  const std::vector<int32_t> node_of = RankNodes(topo);
  auto tier = [&](int32_t a, int32_t b) { return node_of[a] == node_of[b] ? 0 : 1; };
  if (strategy == Strategy::kSap || strategy == Strategy::kHsap) {
    // Groups align with nodes (U is 1 or the devices of a node), so every
    // slot of group v is on node gnode[v] and a row from group w to v
    // crosses nodes iff their nodes differ. Per group, its exact need (over
    // the pool); the rows it receives from its own node come from prefix
    // sums of the rows each node owns, and the rows each group sends to
    // its own node and to others from one sweep of every group's need
    // ranges over the owner map (no per-sender pieces: their count grows
    // as P^2 when one document spans every rank).
    std::vector<int32_t> group_of(P);
    for (int32_t r = 0; r < P; ++r) group_of[r] = r / U;
    std::vector<int32_t> gnode(V);
    for (int32_t v = 0; v < V; ++v) gnode[v] = node_of[v * U];
    std::vector<std::vector<TokenRange>> need(V);
    ForEachIndex(pool, V, [&](int64_t v) {
      std::vector<OwnerSegment> home;
      for (int32_t m = static_cast<int32_t>(v) * U; m < (v + 1) * U; ++m) {
        for (const TokenRange& t : dispatch.ranges[m]) {
          home.push_back({t.begin, t.end, static_cast<int32_t>(v), 0});
        }
      }
      std::sort(home.begin(), home.end(),
                [](const OwnerSegment& a, const OwnerSegment& b) { return a.begin < b.begin; });
      need[v] = ExactNeed(ComputeDemands(index, home), home);
    });
    struct NodeRows {
      std::vector<int64_t> begin, end, before;  // owned runs and the rows before each
      int64_t Below(int64_t x) const {
        const size_t i = static_cast<size_t>(std::upper_bound(begin.begin(), begin.end(), x) -
                                             begin.begin());
        return i == 0 ? 0 : before[i - 1] + std::min(x, end[i - 1]) - begin[i - 1];
      }
    };
    std::vector<NodeRows> node_rows(topo.num_nodes);
    for (const OwnerSegment& o : in.owners) {
      NodeRows& nr = node_rows[gnode[group_of[o.rank]]];
      nr.before.push_back(nr.before.empty() ? 0 : nr.before.back() + nr.end.back() - nr.begin.back());
      nr.begin.push_back(o.begin);
      nr.end.push_back(o.end);
    }
    struct Event {
      int64_t pos;
      int32_t node;
      int32_t delta;
    };
    std::vector<Event> events;
    for (int32_t v = 0; v < V; ++v) {
      const NodeRows& own_node = node_rows[gnode[v]];
      int64_t total = 0, near = 0;
      for (const TokenRange& t : need[v]) {
        total += t.size();
        near += own_node.Below(t.end) - own_node.Below(t.begin);
        events.push_back({t.begin, gnode[v], +1});
        events.push_back({t.end, gnode[v], -1});
      }
      for (int32_t u = 0; u < U; ++u) {
        kv_recv[v * U + u][0] += near * kappa[u];
        kv_recv[v * U + u][1] += (total - near) * kappa[u];
      }
    }
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.pos < b.pos; });
    std::vector<int64_t> cover(topo.num_nodes, 0), sent_near(V, 0), sent_far(V, 0);
    int64_t cover_all = 0;
    size_t e = 0;
    for (const OwnerSegment& o : in.owners) {
      const int32_t w = group_of[o.rank], m = gnode[w];
      for (int64_t x = o.begin; x < o.end;) {
        for (; e < events.size() && events[e].pos <= x; ++e) {
          cover[events[e].node] += events[e].delta;
          cover_all += events[e].delta;
        }
        const int64_t y = e < events.size() ? std::min(o.end, events[e].pos) : o.end;
        sent_near[w] += cover[m] * (y - x);
        sent_far[w] += (cover_all - cover[m]) * (y - x);
        x = y;
      }
    }
    for (int32_t w = 0; w < V; ++w) {
      for (int32_t u = 0; u < U; ++u) {
        kv_send[w * U + u][0] += sent_near[w] * kappa[u];
        kv_send[w * U + u][1] += sent_far[w] * kappa[u];
      }
    }
  } else if (strategy != Strategy::kUlysses) {  // ring, allgather, usp: every other group
    // Slot u of group v receives every other group's rows from slot u of
    // that group, and sends its group's rows to each: per tier, sums over
    // the groups whose slot u is on the same node or on another.
    const int64_t all_tokens = dispatch.total_tokens;
    std::vector<int64_t> node_tokens(topo.num_nodes), node_groups(topo.num_nodes);
    for (int32_t u = 0; u < U; ++u) {
      if (kappa[u] == 0) continue;
      std::fill(node_tokens.begin(), node_tokens.end(), 0);
      std::fill(node_groups.begin(), node_groups.end(), 0);
      for (int32_t w = 0; w < V; ++w) {
        node_tokens[node_of[w * U + u]] += group_tokens[w];
        ++node_groups[node_of[w * U + u]];
      }
      constexpr int kIntra = static_cast<int>(LinkTier::kIntraNode);
      constexpr int kInter = static_cast<int>(LinkTier::kInterNode);
      for (int32_t v = 0; v < V; ++v) {
        const int32_t d = v * U + u, n = node_of[d];
        const int64_t near = node_tokens[n] - group_tokens[v];
        kv_recv[d][kIntra] += near * kappa[u];
        kv_recv[d][kInter] += (all_tokens - node_tokens[n]) * kappa[u];
        kv_send[d][kIntra] += group_tokens[v] * (node_groups[n] - 1) * kappa[u];
        kv_send[d][kInter] += group_tokens[v] * (V - node_groups[n]) * kappa[u];
      }
    }
  }
  if (U > 1) {
    for (int32_t d = 0; d < P; ++d) {
      const int32_t g0 = d / U * U;
      const HeadSlot& mine = slots[d - g0];
      const int64_t nd = in.tokens[d];
      for (int32_t m = g0; m < g0 + U; ++m) {
        if (m == d) continue;
        const HeadSlot& theirs = slots[m - g0];
        const int t = tier(d, m);
        const int64_t nm = in.tokens[m];
        if (mine.num_q() > 0) {  // scatters into my heads: their rows
          hf_recv[d][t] += nm * HeadRowBytes(Payload::kQkvHeads, spec.shape, mine);
          hb_recv[d][t] += nm * HeadRowBytes(Payload::kBwdHeads, spec.shape, mine);
          // gathers of my heads: their rows back to them
          hf_send[d][t] += nm * HeadRowBytes(Payload::kOutLseHeads, spec.shape, mine);
          hb_send[d][t] += nm * HeadRowBytes(Payload::kGradQkvHeads, spec.shape, mine);
        }
        if (theirs.num_q() > 0) {  // my rows to their heads, and back
          hf_send[d][t] += nd * HeadRowBytes(Payload::kQkvHeads, spec.shape, theirs);
          hb_send[d][t] += nd * HeadRowBytes(Payload::kBwdHeads, spec.shape, theirs);
          hf_recv[d][t] += nd * HeadRowBytes(Payload::kOutLseHeads, spec.shape, theirs);
          hb_recv[d][t] += nd * HeadRowBytes(Payload::kGradQkvHeads, spec.shape, theirs);
        }
      }
    }
  }
  double fwd = 0, bwd = 0;
  for (int32_t d = 0; d < P; ++d) {
    const int32_t v = d / U, u = d % U;
    const HeadSlot& mine = slots[u];
    auto seconds = [&](int64_t area) {
      return mine.num_q() > 0 ? 4.0 * static_cast<double>(area) * mine.num_q() * D /
                                    profile.attention_flops
                              : 0.0;
    };
    const double compute = seconds(group_area[v]), own = seconds(own_area[v]);
    double xf = 0, xb = 0, xr = 0, hf = 0, hb = 0;
    for (int t = 0; t < kNumTiers; ++t) {
      const double b = bw[t];
      xf = std::max(xf, static_cast<double>(std::max(kv_send[d][t] + hf_send[d][t],
                                                     kv_recv[d][t] + hf_recv[d][t])) / b);
      xb = std::max(xb, static_cast<double>(std::max(kv_send[d][t] + hb_send[d][t],
                                                     kv_recv[d][t] + hb_recv[d][t])) / b);
      xr = std::max(xr, static_cast<double>(std::max(kv_send[d][t], kv_recv[d][t])) / b);
      hf = std::max(hf, static_cast<double>(std::max(hf_send[d][t], hf_recv[d][t])) / b);
      hb = std::max(hb, static_cast<double>(std::max(hb_send[d][t], hb_recv[d][t])) / b);
    }
    const double bf = profile.backward_factor;
    // The returns move `ratio` times the K/V bytes (fp32 partials).
    fwd = std::max({fwd, compute, xf, hf + std::max(xr, own) + (compute - own)});
    bwd = std::max({bwd, std::max(compute * bf, xb + ratio * xr),
                    hb + std::max((1 + ratio) * xr, own * bf) + (compute - own) * bf});
  }
  return (fwd + bwd) * 1e6;
}

// A tighter lower bound of a strategy's modeled time from its packing: the
// model sums, over stages, the slowest rank's stage time; a forward stage
// takes max(xfer, overlap) + after >= xfer and a backward stage
// max(xfer, A) + after + max(ret, B) >= xfer + ret (the returns mirror the
// transfers: R times the bytes per tier (fp32 partials), directions
// swapped), with xfer the
// rank's transfer term (StageTransferSeconds) over the K/V bytes the packing
// puts in the stage. Head stages (U > 1) have no work items: their model
// time is exactly the slowest rank's transfer term, from the all-to-all
// volumes of HeadStage. Summed in the model's order, so it never exceeds
// the model's time. Far above the closed-form bound when stages are
// unbalanced: at 1M tokens and 512 ranks sap's rises above hsap's time and
// auto no longer builds sap. Compute is left out (the closed form's
// additive term covers a strategy whose time is mostly compute after each
// transfer).
double PackedBoundUs(const PlanSpec& spec, const LevelInputs& in,
                     const InnerPacking& packing, const HardwareProfile& profile);

// A pipelined level's plan may be built one-stage instead (BuildPlan keeps
// the faster): its bound is the lesser of the two packings'.
double LevelBoundUs(const PlanSpec& spec, const LevelInputs& in, const InnerPacking& packing,
                    const HardwareProfile& profile) {
  const double bound = PackedBoundUs(spec, in, packing, profile);
  if (!packing.pipelined) return bound;
  InnerPacking one_stage;
  one_stage.arrivals = packing.arrivals;
  for (auto& av : one_stage.arrivals) {
    for (Arrival& a : av) a.stage = 0;
  }
  one_stage.num_stages = 1;
  return std::min(bound, PackedBoundUs(spec, in, one_stage, profile));
}

double PackedBoundUs(const PlanSpec& spec, const LevelInputs& in,
                     const InnerPacking& packing, const HardwareProfile& profile) {
  const Topology& topo = spec.topology;
  const int32_t P = topo.num_ranks();
  const int32_t S = packing.num_stages;
  const int32_t U = in.U;
  std::vector<int64_t> kappa(U, 0);  // per slot; 0 for a slot without heads
  for (int32_t u = 0; u < U; ++u) {
    if (in.slots[u].num_q() > 0) kappa[u] = KvRowBytes(spec.shape, in.slots[u].num_kv());
  }
  using Tiers = std::array<int64_t, kNumTiers>;
  const std::vector<int32_t> node_of = RankNodes(topo);
  std::vector<Tiers> send(static_cast<size_t>(P) * S, Tiers{}), recv(send.size(), Tiers{});
  for (int32_t v = 0; v < in.V; ++v) {
    for (const Arrival& a : packing.arrivals[v]) {
      for (int32_t u = 0; u < U; ++u) {
        if (kappa[u] == 0) continue;
        const int32_t to = v * U + u, from = a.src * U + u;
        const int t = node_of[to] == node_of[from] ? 0 : 1;
        const int64_t bytes = (a.end - a.begin) * kappa[u];
        recv[static_cast<size_t>(to) * S + a.stage][t] += bytes;
        send[static_cast<size_t>(from) * S + a.stage][t] += bytes;
      }
    }
  }
  std::vector<int64_t> tokens(P, 0);
  for (int32_t d = 0; d < P; ++d) {
    for (const OwnerSegment& o : in.local[d]) tokens[d] += o.end - o.begin;
  }
  auto head_stage = [&](Payload payload, bool to_home) {
    double slowest = 0;
    for (int32_t d = 0; d < P; ++d) {
      const int32_t g0 = d / U * U;
      const HeadSlot& mine = in.slots[d - g0];
      Tiers s{}, r{};
      for (int32_t m = g0; m < g0 + U; ++m) {
        if (m == d) continue;
        const HeadSlot& theirs = in.slots[m - g0];
        const int t = node_of[d] == node_of[m] ? 0 : 1;
        const HeadSlot& send_heads = to_home ? theirs : mine;
        const int64_t send_rows = to_home ? tokens[d] : tokens[m];
        if (send_heads.num_q() > 0 && send_rows > 0) {
          s[t] += send_rows * HeadRowBytes(payload, spec.shape, send_heads);
        }
        const HeadSlot& recv_heads = to_home ? mine : theirs;
        const int64_t recv_rows = to_home ? tokens[m] : tokens[d];
        if (recv_heads.num_q() > 0 && recv_rows > 0) {
          r[t] += recv_rows * HeadRowBytes(payload, spec.shape, recv_heads);
        }
      }
      slowest = std::max(slowest, StageTransferSeconds(profile, s, r));
    }
    return slowest;
  };
  double fwd_us = 0, bwd_us = 0;
  if (U > 1) {
    fwd_us += head_stage(Payload::kQkvHeads, true) * 1e6;
    bwd_us += head_stage(Payload::kBwdHeads, true) * 1e6;
  }
  const int64_t ratio = ReturnBytesRatio(spec.shape.dtype);
  // The returns of stage s's K/V at rank r: directions swapped, fp32
  // partials (`ratio` x bytes).
  auto returns = [&](int32_t r, int32_t s, Tiers* ret_send, Tiers* ret_recv) {
    const size_t i = static_cast<size_t>(r) * S + s;
    for (int t = 0; t < kNumTiers; ++t) {
      (*ret_send)[t] += recv[i][t] * ratio;
      (*ret_recv)[t] += send[i][t] * ratio;
    }
  };
  if (!packing.pipelined) {
    for (int32_t s = 0; s < S; ++s) {
      double slowest = 0, slowest_bwd = 0;
      for (int32_t r = 0; r < P; ++r) {
        const size_t i = static_cast<size_t>(r) * S + s;
        const double x = StageTransferSeconds(profile, send[i], recv[i]);
        Tiers ret_send{}, ret_recv{};
        returns(r, s, &ret_send, &ret_recv);
        slowest = std::max(slowest, x);
        slowest_bwd = std::max(slowest_bwd, x + StageTransferSeconds(profile, ret_send, ret_recv));
      }
      fwd_us += slowest * 1e6;
      bwd_us += slowest_bwd * 1e6;
    }
  } else {
    // Stages 0..S: chunk s's K/V (none in stage S) and, backward, the
    // returns of chunk s - 2 in the same exchange; then the last stage's
    // return phase carries chunk S - 1's (AppendBackwardPipelined).
    for (int32_t s = 0; s <= S; ++s) {
      double slowest = 0, slowest_bwd = 0;
      for (int32_t r = 0; r < P; ++r) {
        Tiers snd{}, rcv{};
        if (s < S) {
          snd = send[static_cast<size_t>(r) * S + s];
          rcv = recv[static_cast<size_t>(r) * S + s];
        }
        slowest = std::max(slowest, StageTransferSeconds(profile, snd, rcv));
        if (s >= 2) returns(r, s - 2, &snd, &rcv);
        double x = StageTransferSeconds(profile, snd, rcv);
        if (s == S) {
          Tiers ret_send{}, ret_recv{};
          returns(r, S - 1, &ret_send, &ret_recv);
          x += StageTransferSeconds(profile, ret_send, ret_recv);
        }
        slowest_bwd = std::max(slowest_bwd, x);
      }
      fwd_us += slowest * 1e6;
      bwd_us += slowest_bwd * 1e6;
    }
  }
  if (U > 1) {
    fwd_us += head_stage(Payload::kOutLseHeads, false) * 1e6;
    bwd_us += head_stage(Payload::kGradQkvHeads, false) * 1e6;
  }
  return fwd_us + bwd_us;
}

}  // namespace

absl::StatusOr<Plan> CompileAuto(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                                 const SliceIndex& index, const Dispatch& dispatch,
                                 const HardwareProfile& profile, ThreadPool* pool) {
  const int32_t P = spec.topology.num_ranks();
  Plan plan;
  // Branch and bound: candidates in order of their modeled-time lower
  // bound; a candidate whose bound exceeds the best modeled time so far
  // cannot win and is not built (its entry in stats.candidates is then
  // the bound, which is above the chosen plan's time). sap's closed-form
  // bound and that of every strategy with point-to-point transfers is
  // raised from its packing (PackedBoundUs) before it is built, and the
  // packing is then reused to build it. The result is the plan a full
  // evaluation picks: lowest modeled time, ties to the earlier of sap,
  // hsap, ring, allgather, ulysses, usp.
  constexpr Strategy kOrder[] = {Strategy::kSap,       Strategy::kHsap,    Strategy::kRing,
                                 Strategy::kAllGather, Strategy::kUlysses, Strategy::kUsp};
  constexpr int kNum = 6;
  BoundInputs in;
  in.owners = BuildOwnerMap(dispatch);
  in.area.assign(P, 0);
  in.tokens.assign(P, 0);
  for (int32_t r = 0; r < P; ++r) {
    in.tokens[r] = dispatch.TokensOf(r);
    for (const TokenRange& t : dispatch.ranges[r]) in.area[r] += RowsArea(index, t.begin, t.end);
  }
  for (Strategy s : kOrder) {
    const int32_t U = HeadGroupSize(s, spec.topology);
    if (in.own_area.count(U) > 0) continue;
    std::vector<int64_t>& own = in.own_area[U];
    own.assign(P / U, 0);
    ForEachIndex(pool, P / U, [&](int64_t v) {
      std::vector<TokenRange> runs;
      for (int32_t m = static_cast<int32_t>(v) * U; m < (v + 1) * U; ++m) {
        runs.insert(runs.end(), dispatch.ranges[m].begin(), dispatch.ranges[m].end());
      }
      own[v] = OwnArea(index, Normalize(std::move(runs)));
    });
  }
  std::vector<StrategyCost> candidates(kNum);
  for (int i = 0; i < kNum; ++i) {
    candidates[i] = {kOrder[i],
                     ModeledLowerBoundUs(spec, index, dispatch, in, kOrder[i], profile, pool)};
  }
  // Strategies with the same head group size and inner-level kind build
  // the same plan (on one node, hsap, ulysses and usp are all one head
  // group with nothing to exchange): equal bounds pick the earliest first,
  // and the later ones, equal in time, could not win: not rebuilt.
  auto signature = [&](Strategy s) {
    const int32_t U = HeadGroupSize(s, spec.topology);
    int kind = 0;  // exact need
    if (s == Strategy::kRing || s == Strategy::kUsp) kind = 1;
    if (s == Strategy::kAllGather) kind = 2;
    if (U == P) kind = -1;  // one group: no inner-level transfers at all
    return std::make_pair(U, kind);
  };
  std::vector<std::pair<std::pair<int32_t, int>, double>> built;
  std::vector<bool> done(kNum, false);
  // Level inputs and packings, computed for the tighter bounds and reused
  // to build (neither is computed twice).
  std::vector<std::optional<PackedLevel>> packings(kNum);
  std::vector<bool> tightened(kNum, false);
  absl::Status first_error;
  int best = -1;
  for (;;) {
    HSAP_RETURN_IF_ERROR(CheckCompileStop());
    // The candidate with the least bound (ties: the earlier).
    int i = -1;
    for (int j = 0; j < kNum; ++j) {
      if (!done[j] && (i < 0 || candidates[j].modeled_us < candidates[i].modeled_us)) i = j;
    }
    if (i < 0) break;
    const double bound = candidates[i].modeled_us;
    // Rounding margin: the bound sums the same terms in another order.
    if (best >= 0 && bound > plan.stats.modeled_us * (1 + 1e-9)) break;
    const auto sig = signature(kOrder[i]);
    auto same = std::find_if(built.begin(), built.end(),
                             [&](const auto& b) { return b.first == sig; });
    if (!tightened[i] && sig.second != -1 && same == built.end()) {
      tightened[i] = true;
      LevelInputs li = MakeLevelInputs(spec, dispatch, kOrder[i]);
      absl::StatusOr<InnerPacking> packed = PackInnerLevel(
          index, li.home, li.owners, li.kind, li.budget_rows, pool, li.pipeline_stages);
      if (!packed.ok()) {  // this strategy cannot be planned here: not a candidate
        if (first_error.ok()) first_error = packed.status();
        done[i] = true;
        continue;
      }
      candidates[i].modeled_us = std::max(bound, LevelBoundUs(spec, li, *packed, profile));
      packings[i] = PackedLevel{std::move(li), std::move(packed).value()};
      continue;  // choose again with the tighter bound
    }
    done[i] = true;
    if (same != built.end()) {
      candidates[i].modeled_us = same->second;
      // The same plan under an earlier name (sap's raised bound can put
      // it after hsap on one device per node): the earlier name wins ties.
      if (best >= 0 && i < best && same->second == plan.stats.modeled_us &&
          signature(kOrder[best]) == sig) {
        plan.strategy = kOrder[i];
        best = i;
      }
      continue;
    }
    absl::StatusOr<Plan> built_plan =
        BuildPlan(spec, slices, index, dispatch, kOrder[i], profile, pool,
                  packings[i] ? &*packings[i] : nullptr);
    if (!built_plan.ok()) {
      // This strategy cannot be planned here (too many stages): not a
      // candidate. Its bound stays in stats.candidates.
      if (first_error.ok()) first_error = built_plan.status();
      continue;
    }
    Plan p = std::move(built_plan).value();
    built.push_back({sig, p.stats.modeled_us});
    candidates[i].modeled_us = p.stats.modeled_us;
    if (best < 0 || p.stats.modeled_us < plan.stats.modeled_us ||
        (p.stats.modeled_us == plan.stats.modeled_us && i < best)) {
      plan = std::move(p);
      best = i;
    }
  }
  if (best < 0) return first_error;
  plan.stats.candidates = std::move(candidates);
  return plan;
}

}  // namespace hsap::plan::internal

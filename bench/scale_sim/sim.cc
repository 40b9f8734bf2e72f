#include "bench/scale_sim/sim.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "common/workload.h"
#include "server/plan/compiler.h"
#include "server/plan/cost_model.h"
#include "server/plan/dispatch.h"
#include "server/plan/plan_spec.h"

namespace hsap::bench {

using plan::Plan;
using plan::Strategy;

const char* SourceName(Source s) { return s == Source::kPlan ? "plan" : "bound"; }

namespace {

bool IsBaseline(Strategy s) {
  return s == Strategy::kRing || s == Strategy::kAllGather || s == Strategy::kUlysses ||
         s == Strategy::kUsp;
}

plan::PlanSpec SpecFor(const std::vector<int64_t>& cu, int32_t nodes, int32_t devices,
                       Strategy strategy, const SimOptions& o) {
  plan::PlanSpec spec;
  spec.cu_seqlens = cu;
  spec.total_tokens = cu.back();
  spec.topology = {nodes, devices};
  spec.shape = o.shape;
  spec.strategy = strategy;
  spec.assignment = o.assignment;
  spec.profile = o.profile;
  return spec;
}

absl::StatusOr<Plan> Compile(const plan::PlanSpec& spec, const SimOptions& o, double* ms) {
  const auto start = std::chrono::steady_clock::now();
  plan::CompileOptions co;
  co.pool = o.pool;
  absl::StatusOr<Plan> p;
  if (o.flat_dispatch) {
    const plan::Dispatch flat = plan::ComputeDispatch(spec.assignment, plan::ResolveSlices(spec),
                                                      spec.total_tokens,
                                                      spec.topology.num_ranks(), o.pool);
    p = plan::CompilePlanForDispatch(spec, flat, co);
  } else {
    p = plan::CompilePlan(spec, co);
  }
  *ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
             .count();
  return p;
}

// Forward receive bytes of one rank of a head group of U ranks (slot u)
// whose members hold `member_tokens` (rank's own first): the head scatter
// brings the other members' Q, K, V rows of its heads, the head gather the
// O (storage dtype) and LSE (fp32) of its own rows computed by the other
// slots.
int64_t HeadStageBytes(const plan::HeadShape& shape, int32_t U, int32_t u,
                       const std::vector<int64_t>& member_tokens) {
  const int64_t b = DTypeSize(shape.dtype), D = shape.head_dim;
  const plan::HeadSlot slot = plan::HeadSlotOf(shape, U, u);
  int64_t others = 0;
  for (size_t m = 1; m < member_tokens.size(); ++m) others += member_tokens[m];
  const int64_t scatter = others * (slot.num_q() + 2 * slot.num_kv()) * D * b;
  const int64_t gather = member_tokens[0] * (shape.num_heads_q - slot.num_q()) * (D * b + 4);
  return scatter + gather;
}

}  // namespace

int64_t ClosedFormBusiestBytes(Strategy strategy, const Plan& p) {
  const plan::HeadShape& shape = p.spec.shape;
  const plan::Topology& topo = p.spec.topology;
  const int32_t P = topo.num_ranks(), dev = topo.devices_per_node;
  const int64_t T = p.spec.total_tokens, b = DTypeSize(shape.dtype), D = shape.head_dim;
  std::vector<int64_t> tokens(P);
  for (int32_t r = 0; r < P; ++r) tokens[r] = p.dispatch.TokensOf(r);
  int64_t busiest = 0;
  switch (strategy) {
    case Strategy::kRing:
    case Strategy::kAllGather:
      // Every other rank's K/V rows, all kv heads.
      for (int32_t r = 0; r < P; ++r) {
        busiest = std::max(busiest, (T - tokens[r]) * 2 * shape.num_heads_kv * D * b);
      }
      return busiest;
    case Strategy::kUlysses:
    case Strategy::kUsp: {
      const int32_t U = strategy == Strategy::kUlysses ? P : dev;
      for (int32_t r = 0; r < P; ++r) {
        const int32_t first = r - r % U, u = r % U;
        std::vector<int64_t> members = {tokens[r]};
        int64_t group_tokens = 0;
        for (int32_t m = first; m < first + U; ++m) {
          group_tokens += tokens[m];
          if (m != r) members.push_back(tokens[m]);
        }
        int64_t bytes = HeadStageBytes(shape, U, u, members);
        // usp: the ring across nodes brings every other node's K/V rows of
        // the slot's kv heads.
        if (strategy == Strategy::kUsp) {
          bytes += (T - group_tokens) * 2 * plan::HeadSlotOf(shape, U, u).num_kv() * D * b;
        }
        busiest = std::max(busiest, bytes);
      }
      return busiest;
    }
    default:
      return -1;
  }
}

namespace {

// What a row needs of a plan, so that no plan outlives its use (at 4,096
// ranks and T = 4M one plan is a few GB).
struct PlanFacts {
  Strategy ran = Strategy::kAuto;
  double modeled_us = 0;
  int64_t busiest = 0;
  int64_t busiest_inter = -1;
  double imbalance = 0;
};

PlanFacts FactsOf(const Plan& p) {
  return {p.strategy, p.stats.modeled_us, p.stats.max_fwd_recv_bytes,
          p.stats.max_fwd_inter_recv_bytes, p.stats.imbalance};
}

}  // namespace

absl::StatusOr<SimPoint> SimulatePoint(const std::vector<int64_t>& lengths, int64_t tokens,
                                       int32_t nodes, int32_t devices, const SimOptions& o) {
  SimPoint out;
  out.tokens = tokens;
  out.nodes = nodes;
  out.devices_per_node = devices;
  out.packs = o.packs;
  HSAP_ASSIGN_OR_RETURN(plan::HardwareProfile profile, plan::ParseHardwareProfile(o.profile));
  for (Strategy s : o.strategies) {
    StrategyRow row;
    row.strategy = row.ran = s;
    out.rows.push_back(row);
  }
  const int32_t P = nodes * devices;
  for (const std::vector<int64_t>& cu : PackDocuments(lengths, tokens, o.packs, o.seed)) {
    double auto_ms = 0, hsap_ms = 0;
    PlanFacts auto_facts, hsap_facts;
    std::vector<plan::StrategyCost> candidates;
    std::vector<int64_t> closed(o.strategies.size(), -1);
    int64_t need = 0;
    {
      HSAP_ASSIGN_OR_RETURN(
          Plan chosen, Compile(SpecFor(cu, nodes, devices, Strategy::kAuto, o), o, &auto_ms));
      auto_facts = FactsOf(chosen);
      candidates = chosen.stats.candidates;
      // Floors and closed forms need only the dispatch and the mask, which
      // do not depend on the strategy.
      const double flops = 4.0 * static_cast<double>(chosen.stats.total_area) *
                           o.shape.num_heads_q * o.shape.head_dim * (1.0 + profile.backward_factor);
      out.floors.compute_us += flops / (P * profile.attention_flops) * 1e6;
      for (const plan::RankPlan& rp : chosen.ranks) need = std::max(need, rp.stats.exact_need_bytes);
      const int64_t inter = chosen.stats.max_node_inter_need_bytes / devices;
      out.floors.inter_need_bytes += inter;
      out.floors.inter_need_us += 2.0 * inter / profile.inter_bytes_per_s * 1e6;
      for (size_t i = 0; i < o.strategies.size(); ++i) {
        closed[i] = ClosedFormBusiestBytes(o.strategies[i], chosen);
      }
      if (chosen.strategy == Strategy::kHsap) {
        hsap_facts = auto_facts;  // the same plan: auto built hsap
        hsap_ms = auto_ms;
      }
    }
    if (hsap_facts.ran != Strategy::kHsap) {
      HSAP_ASSIGN_OR_RETURN(
          Plan hsap, Compile(SpecFor(cu, nodes, devices, Strategy::kHsap, o), o, &hsap_ms));
      hsap_facts = FactsOf(hsap);
    }
    out.floors.exact_need_bytes += need;
    out.floors.exact_need_us += 2.0 * need / profile.inter_bytes_per_s * 1e6;
    for (size_t i = 0; i < out.rows.size(); ++i) {
      StrategyRow& row = out.rows[i];
      const Strategy s = row.strategy;
      const auto cap = o.max_full_ranks.find(s);
      const bool full = cap == o.max_full_ranks.end() || P <= cap->second;
      PlanFacts f;
      if (s == Strategy::kAuto || s == Strategy::kHsap) {
        f = s == Strategy::kAuto ? auto_facts : hsap_facts;
        row.compile_ms += s == Strategy::kAuto ? auto_ms : hsap_ms;
      } else if (full) {
        HSAP_ASSIGN_OR_RETURN(Plan p,
                              Compile(SpecFor(cu, nodes, devices, s, o), o, &row.compile_ms));
        f = FactsOf(p);
      } else {
        row.source = Source::kBound;
        f.ran = s;
        for (const plan::StrategyCost& c : candidates) {
          if (c.strategy == s) f.modeled_us = c.modeled_us;
        }
        // sap has no closed form: its bytes are the exact need.
        f.busiest = closed[i] >= 0 ? closed[i] : need;
      }
      row.ran = f.ran;  // auto: the last pack's choice
      row.modeled_us += f.modeled_us;
      row.busiest_fwd_recv_bytes += f.busiest;
      if (row.source == Source::kBound || f.busiest_inter < 0) {
        row.busiest_inter_fwd_recv_bytes = -1;
      } else if (row.busiest_inter_fwd_recv_bytes >= 0) {
        row.busiest_inter_fwd_recv_bytes += f.busiest_inter;
      }
      row.max_imbalance = std::max(row.max_imbalance, f.imbalance);
    }
  }
  return out;
}

std::string FormatPointTable(const SimPoint& p) {
  double best_baseline = 0;
  for (const StrategyRow& r : p.rows) {
    if (IsBaseline(r.strategy) && (best_baseline == 0 || r.modeled_us < best_baseline)) {
      best_baseline = r.modeled_us;
    }
  }
  std::string out = absl::StrFormat(
      "T = %d, %d nodes x %d = %d GPUs, %d packs (sums over the packs)\n"
      "  %-9s %-9s %-6s %12s %14s %16s %16s %9s\n",
      p.tokens, p.nodes, p.devices_per_node, p.nodes * p.devices_per_node, p.packs, "strategy",
      "ran", "source", "modeled ms", "vs best base", "busiest MiB", "inter MiB", "imbal");
  for (const StrategyRow& r : p.rows) {
    const bool plan = r.source == Source::kPlan && r.busiest_inter_fwd_recv_bytes >= 0;
    absl::StrAppendFormat(&out, "  %-9s %-9s %-6s %12.3f %14.3f %16.1f %16s %9s\n",
                          plan::StrategyName(r.strategy), plan::StrategyName(r.ran),
                          SourceName(r.source), r.modeled_us / 1e3,
                          best_baseline > 0 ? r.modeled_us / best_baseline : 0.0,
                          r.busiest_fwd_recv_bytes / 1048576.0,
                          plan ? absl::StrFormat("%.1f", r.busiest_inter_fwd_recv_bytes / 1048576.0)
                               : std::string("-"),
                          plan ? absl::StrFormat("%.4f", r.max_imbalance) : std::string("-"));
  }
  absl::StrAppendFormat(&out,
                        "  floors: compute %.3f ms; exact need %.1f MiB busiest rank, %.3f ms "
                        "over one inter-node link (fwd + bwd); inter-node need %.1f MiB per "
                        "link of the busiest node, %.3f ms\n",
                        p.floors.compute_us / 1e3, p.floors.exact_need_bytes / 1048576.0,
                        p.floors.exact_need_us / 1e3, p.floors.inter_need_bytes / 1048576.0,
                        p.floors.inter_need_us / 1e3);
  return out;
}

std::string TsvHeader() {
  return "tokens\tnodes\tgpus\tstrategy\tran\tsource\tmodeled_ms\tbusiest_mib\tbusiest_inter_mib"
         "\timbalance\n";
}

std::string PointTsv(const SimPoint& p) {
  std::string out;
  const int32_t gpus = p.nodes * p.devices_per_node;
  for (const StrategyRow& r : p.rows) {
    const bool plan = r.source == Source::kPlan && r.busiest_inter_fwd_recv_bytes >= 0;
    absl::StrAppendFormat(&out, "%d\t%d\t%d\t%s\t%s\t%s\t%.6f\t%.6f\t%s\t%s\n", p.tokens,
                          p.nodes, gpus, plan::StrategyName(r.strategy),
                          plan::StrategyName(r.ran), SourceName(r.source), r.modeled_us / 1e3,
                          r.busiest_fwd_recv_bytes / 1048576.0,
                          plan ? absl::StrFormat("%.6f", r.busiest_inter_fwd_recv_bytes / 1048576.0)
                               : std::string("nan"),
                          plan ? absl::StrFormat("%.6f", r.max_imbalance) : std::string("nan"));
  }
  absl::StrAppendFormat(&out, "%d\t%d\t%d\tcompute_floor\t-\tfloor\t%.6f\t0\t0\tnan\n", p.tokens,
                        p.nodes, gpus, p.floors.compute_us / 1e3);
  absl::StrAppendFormat(&out, "%d\t%d\t%d\texact_need\t-\tfloor\t%.6f\t%.6f\tnan\tnan\n",
                        p.tokens, p.nodes, gpus, p.floors.exact_need_us / 1e3,
                        p.floors.exact_need_bytes / 1048576.0);
  absl::StrAppendFormat(&out, "%d\t%d\t%d\tinter_need\t-\tfloor\t%.6f\t%.6f\t%.6f\tnan\n",
                        p.tokens, p.nodes, gpus, p.floors.inter_need_us / 1e3,
                        p.floors.inter_need_bytes / 1048576.0,
                        p.floors.inter_need_bytes / 1048576.0);
  return out;
}

}  // namespace hsap::bench

// The scale simulator's core: the planner's cost model over packs of a real
// workload, for every strategy, at one (tokens, nodes, devices per node)
// point (bench/scale_sim/README.md).
//
// Per pack it compiles `auto` (whose stats.candidates give every strategy's
// modeled time, or a lower bound of it where auto did not build that
// strategy) and hsap (the floors below come from its per-rank statistics),
// then every other strategy as a full plan while the point has at most
// SimOptions::max_full_ranks ranks for it. Above that (ring, allgather and
// ulysses compile in O(P^2)), the strategy's row is auto's figure, marked
// Source::kBound: a lower bound of its modeled time (equal to it where auto
// built the candidate), and its busiest-rank bytes come from the closed
// forms below, which sim_test checks against compiled plans.
//
//   SimOptions o;  o.shape = {32, 8, 128, DType::kBFloat16};  o.profile = "h100";
//   HSAP_ASSIGN_OR_RETURN(SimPoint r, SimulatePoint(lengths, {1 << 20, 16, 8}, o));
//   std::string table = FormatPointTable(r);
//
// Deterministic: packs from PackDocuments with a fixed seed, plans from the
// (deterministic) compiler; only compile times vary between runs, and they
// are not written to the TSV.
#ifndef HSAP_BENCH_SCALE_SIM_SIM_H_
#define HSAP_BENCH_SCALE_SIM_SIM_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "server/plan/plan.h"
#include "server/plan/plan_spec.h"

namespace hsap::bench {

struct SimOptions {
  plan::HeadShape shape;
  std::string profile = "h100";
  plan::AssignmentPolicy assignment = plan::AssignmentPolicy::kBalanced;
  int32_t packs = 3;
  uint64_t seed = 2026;  // PackDocuments' shuffle
  // The strategies of the rows, in print order (auto included or not).
  std::vector<plan::Strategy> strategies;
  // Full plans for a strategy only up to this many ranks; absent: always.
  std::map<plan::Strategy, int32_t> max_full_ranks;
  ThreadPool* pool = nullptr;  // the compile pool (CompileOptions::pool)
  // Compile every plan on the one-node (rank-level) `balanced` layout of the
  // same ranks, as before the dispatch placed documents on nodes first: the
  // comparison of the two layouts in one run (scale_sim --dispatch=flat).
  bool flat_dispatch = false;
};

enum class Source {
  kPlan,   // modeled from the compiled plan of the strategy
  kBound,  // auto's figure: a lower bound of the modeled time
};
const char* SourceName(Source s);

struct StrategyRow {
  plan::Strategy strategy = plan::Strategy::kAuto;
  plan::Strategy ran = plan::Strategy::kAuto;  // what auto chose; = strategy otherwise
  Source source = Source::kPlan;
  double modeled_us = 0;                // forward + backward, summed over packs
  int64_t busiest_fwd_recv_bytes = 0;   // summed over packs of each pack's busiest rank
  // The same for inter-node bytes only; -1 for kBound rows (no tier split
  // without a plan).
  int64_t busiest_inter_fwd_recv_bytes = 0;
  double max_imbalance = 0;             // rank area imbalance, worst pack (kPlan only)
  double compile_ms = 0;                // summed over packs (kPlan only)
};

// Lower lines of the plots, summed over packs.
struct Floors {
  // Every strategy computes the same allowed pairs: total work over P ranks
  // at the profile's rate, forward + backward.
  double compute_us = 0;
  // Busiest rank's exact need (DESIGN.md §8: the K/V of the keys its queries
  // see that it does not hold, all heads) for the assignment: the bytes sap
  // receives; strategies that move heads instead of tokens can go below.
  int64_t exact_need_bytes = 0;
  // Moving that exact need over one rank's inter-node link, forward and
  // again backward.
  double exact_need_us = 0;
  // The layout's inter-node exact need (DESIGN.md §8) of the busiest node,
  // per inter-node link of it (over its devices): no strategy that computes
  // queries on their own node (all but ulysses) moves less across its links
  // for the assignment.
  int64_t inter_need_bytes = 0;
  // Moving that over the link, forward and again backward: the floor of
  // the inter-node time.
  double inter_need_us = 0;
};

struct SimPoint {
  int64_t tokens = 0;
  int32_t nodes = 0;
  int32_t devices_per_node = 0;
  int32_t packs = 0;
  std::vector<StrategyRow> rows;  // in SimOptions::strategies order
  Floors floors;
};

// REQUIRES: lengths non-empty and positive, options.shape valid, tokens,
// nodes, devices_per_node >= 1. Errors: the compiler's (INVALID_ARGUMENT
// naming the field), e.g. a bad profile string.
absl::StatusOr<SimPoint> SimulatePoint(const std::vector<int64_t>& lengths, int64_t tokens,
                                       int32_t nodes, int32_t devices_per_node,
                                       const SimOptions& options);

// Forward receive bytes of the busiest rank of `strategy` on `plan`'s
// dispatch and topology (plan: any strategy's plan of the same spec), in
// closed form, for ring, allgather, ulysses and usp; -1 for the others.
int64_t ClosedFormBusiestBytes(plan::Strategy strategy, const plan::Plan& plan);

// The point as a text table (one row per strategy: source, modeled ms, its
// ratio to the best baseline, busiest-rank MiB) and the floors.
std::string FormatPointTable(const SimPoint& p);

// Tab-separated rows: header when `header`, then one line per strategy and
// three "floor" lines per point (compute_floor, exact_need, inter_need).
// Columns: tokens nodes gpus strategy ran source modeled_ms busiest_mib
// busiest_inter_mib (nan for bound rows) imbalance (nan for bound rows).
std::string TsvHeader();
std::string PointTsv(const SimPoint& p);

}  // namespace hsap::bench

#endif  // HSAP_BENCH_SCALE_SIM_SIM_H_

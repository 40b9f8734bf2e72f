// The plan compiler: a pure function from a PlanSpec to an immutable Plan.
//
// No I/O, no devices, deterministic: every node compiles the same plan from
// the same spec, and only plan keys are compared across nodes. Cost is
// interval arithmetic over documents and rank ranges (never per token):
// O(slices log slices + P * runs per rank) for sap/allgather/hsap, plus
// O(P^2) for ring (P - 1 rounds per rank) and ulysses (a P-way all-to-all);
// auto skips those when their lower bound shows they cannot win.
//
// Example:
//   HSAP_ASSIGN_OR_RETURN(Plan plan, CompilePlan(spec));
//   for (const RankPlan& r : plan.ranks) ... r.forward[s].sends ...
#ifndef HSAP_SERVER_PLAN_COMPILER_H_
#define HSAP_SERVER_PLAN_COMPILER_H_

#include <functional>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "server/plan/plan.h"
#include "server/plan/plan_spec.h"

namespace hsap::plan {

// Validates `spec` (ValidatePlanSpec: INVALID_ARGUMENT naming the field) and
// compiles it. Strategy kAuto returns the strategy with the lowest modeled
// time (ties: the earlier of sap, hsap, ring, allgather, ulysses, usp). It
// computes a closed-form lower bound of every strategy's modeled time and
// builds candidates in order of their bound, skipping those whose bound
// exceeds the best modeled time so far (they cannot win): the result is
// that of building all six. stats.candidates lists all six in that order:
// the modeled time of each built candidate, the lower bound (above the
// chosen plan's time) of each skipped one.
//
// How a compilation runs, not what it produces: not part of the plan key.
struct CompileOptions {
  // Spreads the per-rank work (dispatch attempts, demands, stage lists, work
  // items, statistics) over this pool when the topology has at least 64
  // ranks; nullptr: the calling thread only. The plan is the same, bit for
  // bit, whatever the pool. Concurrent compilations sharing a pool take
  // turns in its parallel loops.
  ThreadPool* pool = nullptr;
  // Asked between the compiler's phases (dispatch, each strategy auto
  // builds, the inner level, the ranks' stages) on the calling thread: true
  // ends the compile with CANCELLED ("the compile's caller gave up"), so a
  // compile nobody waits for any more stops. May be null.
  const std::function<bool()>* stop = nullptr;
};
absl::StatusOr<Plan> CompilePlan(const PlanSpec& spec, const CompileOptions& options = {});

// Compiles `spec` with a given assignment instead of spec.assignment's
// (a data loader's own layout). INVALID_ARGUMENT when `dispatch` is not a
// partition of [0, total_tokens) over the topology's ranks.
absl::StatusOr<Plan> CompilePlanForDispatch(const PlanSpec& spec, const Dispatch& dispatch,
                                            const CompileOptions& options = {});

// The head slot of position `u` in a head-parallel group of `group_size`:
// q heads [u Hq / U, (u + 1) Hq / U) (possibly empty when Hq < U: that rank
// computes nothing and only moves data) and the kv heads they read,
// [qb / g, ceil(qe / g)) with g = Hq / Hkv (a kv head is replicated on every
// slot that has one of its q heads).
struct HeadSlot {
  int32_t q_begin = 0, q_end = 0, kv_begin = 0, kv_end = 0;
  int32_t num_q() const { return q_end - q_begin; }
  int32_t num_kv() const { return kv_end - kv_begin; }
};
HeadSlot HeadSlotOf(const HeadShape& shape, int32_t group_size, int32_t u);

// Ranks that share a head all-to-all under `strategy`: 1 for ring, allgather
// and sap; the devices of a node for usp and hsap; every rank for ulysses.
int32_t HeadGroupSize(Strategy strategy, const Topology& topology);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_COMPILER_H_

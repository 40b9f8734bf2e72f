// Internal to the compiler: building one strategy's plan (compiler.cc) and
// choosing among the strategies for `auto` (auto_search.cc).
#ifndef HSAP_SERVER_PLAN_BUILD_PLAN_H_
#define HSAP_SERVER_PLAN_BUILD_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mask.h"
#include "common/thread_pool.h"
#include "server/plan/compiler.h"
#include "server/plan/cost_model.h"
#include "server/plan/demand.h"
#include "server/plan/dispatch.h"
#include "server/plan/inner_level.h"
#include "server/plan/plan.h"

namespace hsap::plan::internal {

// CANCELLED when the current compile's CompileOptions::stop says so (set
// for the calling thread by CompilePlan for the compile's duration).
absl::Status CheckCompileStop();
// Sets the calling thread's stop callback; returns the previous one.
const std::function<bool()>* SetCompileStop(const std::function<bool()>* stop);
// The calling thread's stop callback (null: none), for long loops that run
// on the pool's threads (which have none of their own).
const std::function<bool()>* CurrentCompileStop();

// Per-row bytes of a head all-to-all payload for a slot (wire_layout.h).
int64_t HeadRowBytes(Payload p, const HeadShape& shape, const HeadSlot& slot);

// The node of every rank (a table: link tiers are looked up per transfer).
std::vector<int32_t> RankNodes(const Topology& t);

// What the inner level of a strategy starts from: the ranks' runs at their
// local rows, the virtual ranks' runs at their home rows, the owner map, the
// head slots and the receive budget in rows.
struct LevelInputs {
  int32_t U = 1;
  int32_t V = 1;
  std::vector<std::vector<OwnerSegment>> local;  // per rank
  std::vector<std::vector<OwnerSegment>> home;   // per virtual rank
  std::vector<int64_t> home_offset;              // per rank: first home row in its group
  std::vector<OwnerSegment> owners;              // rank = virtual rank
  std::vector<HeadSlot> slots;
  int64_t budget_rows = 1;
  InnerKind kind = InnerKind::kExactNeed;
  // Chunks of a pipelined inner level (PackInnerLevel); 1: not pipelined.
  int32_t pipeline_stages = 1;
};


// The chunks of hsap's pipelined inter-node stage (docs/planner.md, "The
// pipelined inter-node stage": 4, 8 and 16 modeled 1.156, 1.137 and 1.219
// times the compute floor at 16 x 8, T = 1M).
inline constexpr int32_t kHsapPipelineStages = 8;

LevelInputs MakeLevelInputs(const PlanSpec& spec, const Dispatch& dispatch, Strategy strategy);

// A strategy's level inputs and their packing (PackInnerLevel), as auto
// computes them for a bound before deciding to build.
struct PackedLevel {
  LevelInputs inputs;
  InnerPacking packing;
};

// The plan of `strategy` (not auto); `packed`, when given, holds this
// strategy's level inputs and packing, which are then not computed again
// (and are consumed).
absl::StatusOr<Plan> BuildPlan(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                               const SliceIndex& index, const Dispatch& dispatch,
                               Strategy strategy, const HardwareProfile& profile,
                               ThreadPool* pool, PackedLevel* packed = nullptr);

// The plan of the strategy with the lowest modeled time (CompilePlan's
// contract for Strategy::kAuto), with stats.candidates filled.
absl::StatusOr<Plan> CompileAuto(const PlanSpec& spec, const std::vector<MaskSlice>& slices,
                                 const SliceIndex& index, const Dispatch& dispatch,
                                 const HardwareProfile& profile, ThreadPool* pool);

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_BUILD_PLAN_H_

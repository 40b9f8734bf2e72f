// Internal to the compiler: the point-to-point level of a plan.
//
// The ranks of this level are *virtual ranks*: a rank itself (ring,
// allgather, sap) or the union of a head-parallel group (usp, hsap: a node).
// Each virtual rank has home rows (global runs at home row offsets). The
// level decides which K/V rows travel where, in which stage, into which
// receive-buffer rows, and the work items; transfer sizes are in *rows* here
// (Transfer::bytes and buffer_offset count rows) and are scaled to bytes per
// head slot by the compiler.
#ifndef HSAP_SERVER_PLAN_INNER_LEVEL_H_
#define HSAP_SERVER_PLAN_INNER_LEVEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "server/plan/demand.h"
#include "server/plan/dispatch.h"
#include "server/plan/plan.h"

namespace hsap::plan::internal {

enum class InnerKind {
  kRing,       // round k delivers virtual rank (v - k)'s rows, chunked by the budget
  kAllGather,  // every other virtual rank's rows, packed by the budget
  kExactNeed,  // only the keys the rank's queries see (sap)
};

struct InnerRank {
  std::vector<Stage> stages;  // all virtual ranks: the same count, >= 1
  // The arrays the stages' sends and recvs are views of (null when empty):
  // whoever owns the rank alone may rewrite them in place (BuildPlan scales
  // a one-rank virtual rank's transfers to bytes there).
  std::shared_ptr<std::vector<Transfer>> send_pool, recv_pool;
  int64_t exact_need_rows = 0;
  int64_t area = 0;  // allowed pairs computed
  // Per stage: the allowed pairs of {overlap_items, items} (the cost model's
  // inputs; the ranks of a head group share them).
  std::vector<std::array<int64_t, 2>> stage_area;
  // A pipelined level (InnerPacking::pipelined): stages 0..K-1 receive
  // chunks 0..K-1 into rows that continue from chunk to chunk (the buffer
  // holds all of them), stage c's overlap_items are the items on chunk
  // c - 1 (and stage 0's the home items), and a last stage K with no
  // transfers computes the items on chunk K - 1 (in its overlap_items).
  bool pipelined = false;
};

// One run of K/V rows a virtual rank receives.
struct Arrival {
  int32_t src = 0;
  int32_t stage = 0;
  int64_t begin = 0;  // global
  int64_t end = 0;
  int64_t src_row = 0;  // home row of `begin` on src
  int64_t recv_row = 0;  // receive-buffer row of `begin` (set by BuildInnerLevel)
};

// The first half of the level: what every virtual rank needs and receives,
// from whom and in which stage, before any list is built. Cheap next to the
// second half; `auto` bounds sap's modeled time from it (compiler.cc).
struct InnerPacking {
  std::vector<std::vector<Demand>> demands;    // per virtual rank
  std::vector<std::vector<Arrival>> arrivals;  // per virtual rank
  std::vector<int64_t> exact_need_rows;        // per virtual rank
  int32_t num_stages = 1;  // stages that move rows (a pipelined level adds one)
  // The exact need fit one stage and was cut into num_stages chunks (each
  // sender's rows to each receiver in near-equal parts) that are received
  // one stage after another while the previous chunk computes.
  bool pipelined = false;
};

// REQUIRES: home[v] lists virtual rank v's runs in home-row order; owners is
// the union of all home runs sorted by global position (rank = virtual rank)
// and partitions [0, T); budget_rows >= 1. INVALID_ARGUMENT when the budget
// would need more than kMaxStages stages. Virtual ranks are handled over
// `pool` when set (same result). With pipeline_stages K > 1 an exact-need
// level that fits one stage of the budget is pipelined over K chunks.
absl::StatusOr<InnerPacking> PackInnerLevel(const SliceIndex& index,
                                            const std::vector<std::vector<OwnerSegment>>& home,
                                            const std::vector<OwnerSegment>& owners,
                                            InnerKind kind, int64_t budget_rows,
                                            ThreadPool* pool = nullptr,
                                            int32_t pipeline_stages = 1);

// The level built from its packing (same inputs as PackInnerLevel's).
std::vector<InnerRank> BuildInnerLevel(const SliceIndex& index,
                                       const std::vector<OwnerSegment>& owners,
                                       InnerPacking packing, ThreadPool* pool = nullptr);

// PackInnerLevel, then BuildInnerLevel.
absl::StatusOr<std::vector<InnerRank>> BuildInnerLevel(
    const SliceIndex& index, const std::vector<std::vector<OwnerSegment>>& home,
    const std::vector<OwnerSegment>& owners, InnerKind kind, int64_t budget_rows,
    ThreadPool* pool = nullptr, int32_t pipeline_stages = 1);

}  // namespace hsap::plan::internal

#endif  // HSAP_SERVER_PLAN_INNER_LEVEL_H_

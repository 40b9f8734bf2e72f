// One rank's layout for one pass of a plan: every size, offset and check the
// executor needs, computed before anything is allocated or touched. Pure: a
// function of the plan, the rank, the pass, the shape and which buffers are
// bound (their pointers are only tested for null).
//
// LayoutFor() checks the plan against itself (rank plans, head slots,
// transfer sizes against the wire layout, rows inside their row spaces,
// receives in whole rows) and the call against the plan (shape, buffers);
// after it succeeds the stage loop runs without further checks.
//
// Row spaces (plan.h): local rows (the rank's own tokens), home rows (what
// it computes on: the local rows, or under head parallelism every member's
// rows of its head group), and the stage receive buffer.
#ifndef HSAP_SERVER_EXEC_RANK_LAYOUT_H_
#define HSAP_SERVER_EXEC_RANK_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/attention_params.h"
#include "server/exec/pack.h"
#include "server/plan/plan.h"

namespace hsap::exec {

// One rank's tensors, rows in assignment order (its dispatch ranges
// concatenated; T_local = plan.dispatch.TokensOf(rank)). Pointers may be
// null when T_local == 0.
struct RankBuffers {
  const void* q = nullptr;  // [T_local, Hq, D] dtype
  const void* k = nullptr;  // [T_local, Hkv, D] dtype
  const void* v = nullptr;  // [T_local, Hkv, D] dtype
  // Forward outputs; backward inputs (the forward's results).
  void* o = nullptr;      // [T_local, Hq, D] dtype
  float* lse = nullptr;   // [Hq, T_local] fp32, natural log; -inf for rows that see no key
  // Backward only.
  const void* d_o = nullptr;  // [T_local, Hq, D] dtype
  void* dq = nullptr;         // [T_local, Hq, D] dtype (written)
  void* dk = nullptr;         // [T_local, Hkv, D] dtype (written)
  void* dv = nullptr;         // [T_local, Hkv, D] dtype (written)
};

enum class Pass : int { kForward = 0, kBackward = 1 };

struct RankLayout {
  Pass pass = Pass::kForward;
  int32_t rank = 0;
  int32_t num_ranks = 1;
  int32_t head_group_size = 1;   // U
  kernels::AttentionShape shape;  // the call's, softmax_scale resolved
  int64_t elem_bytes = 0;         // of shape.dtype
  const plan::RankPlan* rank_plan = nullptr;
  const std::vector<plan::Stage>* stages = nullptr;  // this pass's

  // The rank's head slot and how it is cut into kernel calls.
  int32_t q_head_begin = 0, q_head_end = 0, kv_head_begin = 0, kv_head_end = 0;
  int32_t num_q_heads = 0, num_kv_heads = 0;  // of the slot
  std::vector<HeadGroup> groups;
  std::vector<int32_t> q_widths, kv_widths;  // heads per group

  int64_t local_rows = 0;
  int64_t home_rows = 0;
  int64_t own_home_row = 0;  // first home row holding this rank's own tokens
  int64_t recv_rows = 0;     // rows of the largest stage receive buffer
  int64_t kv_row_elems = 0;  // elements of one interleaved K/V row (2 * nkv * D)
  // Bytes of the buffers reused by every stage.
  int64_t return_bytes = 0;        // returned dK/dV partials landing
  int64_t send_staging_bytes = 0;  // packed sends of the largest exchange
  int64_t recv_staging_bytes = 0;  // receives that do not land in place

  bool backward() const { return pass == Pass::kBackward; }
  // LSE columns of the rows computed on (home rows; local rows when U == 1).
  int64_t lse_stride() const { return head_group_size == 1 ? local_rows : home_rows; }
  // The shape of one kernel call for head group `g`.
  kernels::AttentionShape GroupShape(const HeadGroup& g) const {
    kernels::AttentionShape s = shape;
    s.num_heads_q = g.num_q;
    s.num_heads_kv = g.num_kv;
    return s;
  }
};

// INVALID_ARGUMENT for a rank out of range, a shape that is not the plan's,
// a softmax_scale that is negative or not finite, or a null buffer the pass
// needs; INTERNAL for a plan inconsistent with itself (naming the rank,
// pass, stage and transfer or item).
absl::StatusOr<RankLayout> LayoutFor(const plan::Plan& plan, int32_t rank, Pass pass,
                                     const kernels::AttentionShape& shape,
                                     const RankBuffers& buffers);

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_RANK_LAYOUT_H_

// The compiled plan: an immutable value, plain data (DESIGN.md §5). Its lists
// share storage through SharedList (copy on write, reference counted), never
// through raw pointers into other objects, so a Plan can be copied,
// compared and serialized as a value. Built once by CompilePlan() (compiler.h), cached (plan_cache.h),
// serialized (plan_proto.h) and interpreted by the executor, which knows
// nothing of documents.
//
// Row spaces. Every rank stores its own tokens in assignment order (its
// Dispatch ranges concatenated): the *local rows*. A rank computes on its
// *home rows*:
//  * without head parallelism (ring, allgather, sap): home rows = local rows,
//    all heads;
//  * with head parallelism over a group of U ranks (ulysses: all ranks; usp
//    and hsap: the devices of one node) the forward begins with a head
//    scatter (all-to-all): afterwards each rank holds, for its slot of heads
//    [q_head_begin, q_head_end) / [kv_head_begin, kv_head_end), the rows of
//    every group member, concatenated in member order: those are its home
//    rows. The plan ends with a head gather returning O and LSE.
// The third space is the stage's *receive buffer*: K/V rows received in
// that stage, each row `kv_row_bytes` = 2 * (kv heads of the rank) * D * dtype
// bytes (K heads then V heads, so K and V of a row are interleaved with row
// stride 2 * Hkv_slot * D elements: FwdWorkItem.kv_row_stride).
//
// Stages. Each rank's forward (and backward) is a list of stages of the same
// length on every rank (stage s is one collective step; empty where a rank has
// nothing to do). In a stage the executor posts `sends` and `recvs` (one
// group, sorted by peer, then payload), runs `overlap_items` (they read no
// receive row this stage receives into), waits, runs `items`; in backward
// stages it then posts `return_sends`/`return_recvs`: the dK/dV partials of
// received rows go back to their owners, which add them to their own dK/dV
// after running `return_overlap_items` (home items held back to compute
// while the returns fly).
// A pipelined inner level (hsap across nodes) receives its K/V in chunks,
// one stage each, into rows that stay until the last stage: stage c's
// overlap_items compute on chunk c - 1, and a backward exchange carries,
// beside chunk c's K/V, the returns (kGradKv) of chunk c - 2, added to the
// home dK/dV when it completes (docs/planner.md).
// Every send of rank a to rank b in stage s has an identical receive on b
// from a in stage s (same payload, segments' global ranges, bytes).
#ifndef HSAP_SERVER_PLAN_PLAN_H_
#define HSAP_SERVER_PLAN_PLAN_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/mask.h"
#include "server/plan/dispatch.h"
#include "server/plan/plan_key.h"
#include "server/plan/plan_spec.h"
#include "server/plan/shared_list.h"
#include "server/plan/wire_layout.h"

namespace hsap::plan {

// Bump when the meaning or layout of a plan changes: it is hashed into keys.
// 2: dK/dV partials travel in fp32; 3: `balanced` places documents on nodes
// first on several nodes; 4: backward stages compute home items while their
// returns fly (Stage::return_overlap_items); 5: hsap's inter-node stage is
// pipelined (chunks received while the previous one computes; returns ride
// later exchanges).
inline constexpr uint32_t kPlanFormatVersion = 5;

enum class LinkTier : uint8_t {
  kIntraNode = 0,  // NVLink / shared memory
  kInterNode = 1,  // InfiniBand / TCP
};
inline constexpr int kNumTiers = 2;

enum class RowSpace : uint8_t {
  kLocal = 0,  // the rank's own token rows (assignment order)
  kHome = 1,   // the rows it computes on (see above)
  kRecv = 2,   // the stage's receive buffer
};

// What each row of a transfer carries: plan::Payload, defined with the wire
// layout of every kind (wire_layout.h).

// A run of rows: global tokens [global_begin, global_end) at rows
// [row, row + size) of the transfer's row space.
struct Segment {
  int64_t global_begin = 0;
  int64_t global_end = 0;
  int64_t row = 0;
  bool operator==(const Segment& o) const {
    return global_begin == o.global_begin && global_end == o.global_end && row == o.row;
  }
};

// One point-to-point transfer. For a send, `space`/rows are where the rows
// are read; for a receive, where they are written (kGradKv receives: the home
// rows the partials are added to, after landing at `buffer_offset` of the
// return buffer). Heads: the q/kv heads the rows carry.
struct Transfer {
  int32_t peer = 0;
  Payload payload = Payload::kKv;
  LinkTier tier = LinkTier::kIntraNode;
  RowSpace space = RowSpace::kLocal;
  int32_t q_head_begin = 0;
  int32_t q_head_end = 0;
  int32_t kv_head_begin = 0;
  int32_t kv_head_end = 0;
  SharedList<Segment> segments;  // shared with the plan's other copies
  int64_t buffer_offset = 0;  // receives into a buffer: bytes from its start
  int64_t bytes = 0;

  int64_t rows() const {
    int64_t n = 0;
    for (const Segment& s : segments) n += s.global_end - s.global_begin;
    return n;
  }
  bool operator==(const Transfer& o) const;
};

// One partial attention, 1:1 with kernels::cpu::FwdWorkItem/BwdWorkItem:
// home rows [q_row, q_row + num_q) of the rank's heads against K/V rows
// [kv_row, kv_row + num_k) of `kv_space` (kHome or kRecv), mask rule
// (type, offset, window) relative to those ranges (common/mask.h).
struct WorkItem {
  int64_t q_row = 0;
  int64_t num_q = 0;
  int64_t kv_row = 0;
  int64_t num_k = 0;
  int64_t offset = 0;
  int64_t window = -1;
  RowSpace kv_space = RowSpace::kHome;  // (the two small fields last: 56 bytes)
  MaskType type = MaskType::kFull;
  bool operator==(const WorkItem& o) const;
};

// A stage's lists are shared where the plan repeats them (shared_list.h):
// a backward stage has its forward stage's sends, receives and items, and
// the ranks of a head group have the same items.
using TransferList = SharedList<Transfer>;
using WorkItemList = SharedList<WorkItem>;

struct Stage {
  TransferList sends;  // sorted by peer
  TransferList recvs;  // sorted by peer
  WorkItemList overlap_items;
  WorkItemList items;
  TransferList return_sends;  // backward only
  TransferList return_recvs;  // backward only
  // Backward only: home items (they read no received row) computed while
  // the returns are in flight, after `items`; the returns are added after
  // them, so home accumulators still sum home work first, then returns.
  WorkItemList return_overlap_items;
  bool operator==(const Stage& o) const;
};

// Per-rank statistics. Bytes count every transfer of the forward (fwd_*) or
// backward (bwd_*) plan, by link tier.
struct RankStats {
  int64_t tokens = 0;        // local rows
  int64_t home_tokens = 0;   // home rows
  int64_t area = 0;          // allowed (q, k) pairs computed, per head of the slot
  int64_t head_area = 0;     // area * q heads computed: the compute work
  std::array<int64_t, kNumTiers> fwd_recv_bytes{};
  std::array<int64_t, kNumTiers> fwd_send_bytes{};
  std::array<int64_t, kNumTiers> bwd_recv_bytes{};
  std::array<int64_t, kNumTiers> bwd_send_bytes{};
  // Fewest forward receive bytes any plan of this strategy's family needs
  // for this assignment (DESIGN.md §8): exact need x kappa, plus, under head
  // parallelism, the head all-to-all volume.
  int64_t lower_bound_recv_bytes = 0;
  // Exact-need K/V bytes of this rank's own tokens with all heads (the
  // point-to-point bound, reported for every strategy).
  int64_t exact_need_bytes = 0;
  // Largest one-stage receive buffer: K/V rows, or returned fp32 dK/dV
  // partials (up to ReturnBytesRatio times the budget).
  int64_t peak_recv_buffer_bytes = 0;
  // Modeled times (cost_model.h), microseconds.
  double fwd_compute_us = 0;
  double bwd_compute_us = 0;
  std::array<double, kNumTiers> fwd_transfer_us{};
  std::array<double, kNumTiers> bwd_transfer_us{};
  double fwd_us = 0;  // with overlap
  double bwd_us = 0;

  int64_t FwdRecvBytes() const { return fwd_recv_bytes[0] + fwd_recv_bytes[1]; }
  int64_t FwdSendBytes() const { return fwd_send_bytes[0] + fwd_send_bytes[1]; }
  int64_t BwdRecvBytes() const { return bwd_recv_bytes[0] + bwd_recv_bytes[1]; }
  int64_t BwdSendBytes() const { return bwd_send_bytes[0] + bwd_send_bytes[1]; }
  bool operator==(const RankStats& o) const;
};

struct RankPlan {
  int32_t rank = 0;
  int32_t node = 0;
  int32_t q_head_begin = 0;  // heads this rank computes
  int32_t q_head_end = 0;
  int32_t kv_head_begin = 0;
  int32_t kv_head_end = 0;
  int64_t kv_row_bytes = 0;  // bytes of one receive-buffer row
  std::vector<Stage> forward;
  std::vector<Stage> backward;
  RankStats stats;
  bool operator==(const RankPlan& o) const;
};

// Modeled time of one strategy (auto records every candidate).
struct StrategyCost {
  Strategy strategy = Strategy::kSap;
  double modeled_us = 0;
  bool operator==(const StrategyCost& o) const {
    return strategy == o.strategy && modeled_us == o.modeled_us;
  }
};

struct PlanStats {
  int64_t total_area = 0;         // allowed pairs of the mask
  double imbalance = 0;           // max_r head_area / mean head_area (1 when no area)
  int64_t max_fwd_recv_bytes = 0;  // busiest rank
  int64_t total_fwd_bytes = 0;    // sum over ranks of forward receive bytes
  int64_t total_bwd_bytes = 0;
  std::array<int64_t, kNumTiers> total_fwd_bytes_by_tier{};
  // Inter-node forward receive bytes of the busiest rank (the sum over
  // ranks is total_fwd_bytes_by_tier[kInterNode]).
  int64_t max_fwd_inter_recv_bytes = 0;
  // The inter-node exact need of the layout (DESIGN.md §8), x kappa (K and
  // V, every head): summed over nodes, and of the busiest node. No plan
  // that computes each query on its own node (every strategy but ulysses
  // over several nodes, which moves queries instead) moves fewer forward
  // bytes across nodes for this assignment; 0 on one node.
  int64_t inter_node_need_bytes = 0;
  int64_t max_node_inter_need_bytes = 0;
  double fwd_us = 0;  // modeled layer time: sum over stages of the slowest rank
  double bwd_us = 0;
  double modeled_us = 0;  // fwd_us + bwd_us
  double lower_bound_us = 0;  // max(max compute, max bytes / bandwidth), fwd + bwd
  int64_t compile_us = 0;
  int32_t num_fwd_stages = 0;
  int32_t num_bwd_stages = 0;
  std::vector<StrategyCost> candidates;  // auto only
  bool operator==(const PlanStats& o) const;
};

struct Plan {
  uint32_t format_version = kPlanFormatVersion;
  PlanKey key;
  PlanSpec spec;                 // the request (strategy may be kAuto)
  Strategy strategy = Strategy::kSap;  // what runs (never kAuto)
  int32_t head_group_size = 1;   // U: ranks sharing a head all-to-all
  Dispatch dispatch;
  std::vector<RankPlan> ranks;
  PlanStats stats;

  // Approximate heap footprint, for the cache's byte bound.
  int64_t ApproxBytes() const;
  bool operator==(const Plan& o) const;
};

// Human-readable summary: strategy, per-rank tokens/bytes/area, stats.
std::string PlanSummaryText(const Plan& plan);

absl::string_view PayloadName(Payload p);

}  // namespace hsap::plan

#endif  // HSAP_SERVER_PLAN_PLAN_H_

// The executor: interprets one rank's part of a compiled plan (plan.h) on
// bound buffers, with a transport and a compute backend (DESIGN.md §6). It
// knows nothing of documents — only rows, heads, transfers and work items —
// and nothing of devices: memory, copies and kernels are the backend's
// (compute_backend.h), sizes and checks the layout's (rank_layout.h), the
// row format of every transfer the wire layout's (plan/wire_layout.h).
//
// Per stage (plan.h): pack the send rows into a contiguous staging buffer,
// Start the grouped exchange (sends and receives in plan order), run the
// stage's overlap_items while the bytes travel, Wait (with the deadline),
// land the received rows, run the items. Backward stages then return the
// dK/dV partials of the rows received in the stage to their owners
// (return_sends / return_recvs), which add them to their own. Partial
// outputs merge with log-sum-exp into fp32 accumulators (the kernels'
// Forward does it per item); gradients accumulate in fp32; outputs are cast
// to the storage dtype once at the end (under head parallelism the head
// gather carries O, dQ, dK, dV as the wire layout says).
//
// Head parallelism (ulysses, usp, hsap): the first stage scatters Q/K/V (or
// Q, K, V, O, dO, LSE) to the home rows of each rank's head slot, the last
// gathers O/LSE (or dQ, dK, dV) back to the owners of the tokens; a rank's
// own rows are copied locally (they are never a transfer of the plan). A kv
// head shared by two slots (GQA with Hq not a multiple of the group's kv
// split) gets dK/dV from both, which the owner adds.
//
// Buffers: the K/V receive buffer (and, backward, the returned dK/dV
// buffer) is sized by the plan (largest stage, within spec.recv_buffer_bytes),
// allocated once per call and reused across stages; staging for sends and
// for head payloads likewise. A backend that cannot address host memory
// gets the rank's inputs uploaded first and its outputs downloaded last.
//
// Tags: every exchange of a call uses ExchangeTag(call_tag, pass, stage,
// phase), distinct per (pass, stage, phase) and per call_tag, so no two
// stages or calls can ever match each other's messages.
//
// Faults: any transport or backend error ends the rank's run at once with
// that status (ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ...); every
// wait carries the deadline, so a missing or dead peer never hangs a rank.
// After an error the outputs are partially written.
//
// Thread-safety: one call per rank at a time; the P ranks of a group run
// concurrently (one thread each), each with its backend (backends may be
// shared: the CPU backend's pool serialises concurrent callers).
//
// Example (one rank's thread):
//   RankBuffers b{q, k, v, o, lse};
//   CpuBackend backend(2);
//   ExecStats stats;
//   HSAP_RETURN_IF_ERROR(RunForward(plan, rank, shape, b, transport, &backend,
//                                   absl::Now() + absl::Seconds(30), call_seq, &stats));
#ifndef HSAP_SERVER_EXEC_EXECUTOR_H_
#define HSAP_SERVER_EXEC_EXECUTOR_H_

#include <array>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/attention_params.h"
#include "server/exec/compute_backend.h"
#include "server/exec/rank_layout.h"
#include "server/plan/plan.h"
#include "server/transport/transport.h"

namespace hsap::exec {

// What one rank's run did.
struct ExecStats {
  // Bytes the transport counted for this run, by tier (plan::LinkTier).
  std::array<int64_t, 2> sent_bytes{};
  std::array<int64_t, 2> received_bytes{};
  // Allowed (q, k) pairs of the executed work items, per head of the rank's
  // slot: equals plan RankStats.area. head_area = area * q heads of the slot
  // (RankStats.head_area).
  int64_t area = 0;
  int64_t head_area = 0;
  int64_t recv_buffer_bytes = 0;  // K/V receive buffer (+ returned dK/dV buffer), allocated
  int32_t stages = 0;
  double compute_seconds = 0;  // in the backend's kernels (queued, for an asynchronous one)
  double wait_seconds = 0;     // blocked in PendingExchange::Wait
  double total_seconds = 0;
};

// The tag of phase `phase` (0: stage transfers, 1: dK/dV returns) of stage
// `stage` of `pass` (0: forward, 1: backward) of call `call_tag`:
// call_tag << 24 | pass << 23 | stage << 1 | phase.
// REQUIRES: call_tag < 2^40, stage < 2^22 (RunForward/RunBackward check).
uint64_t ExchangeTag(uint64_t call_tag, int pass, int32_t stage, int phase);

// Runs rank `rank`'s forward plan: writes o and lse. `shape` must match
// plan.spec.shape (softmax_scale 0 means 1/sqrt(D)). INVALID_ARGUMENT for a
// mismatched shape, rank, transport or missing buffer (LayoutFor);
// FAILED_PRECONDITION for a backend whose memory the transport cannot move;
// INTERNAL for a plan inconsistent with itself; transport and backend
// errors as returned by them. `stats` may be null. The kernels give up within
// a block of work (a few milliseconds) once `deadline` passes
// (DEADLINE_EXCEEDED) or `cancelled` (may be empty) returns true (CANCELLED).
absl::Status RunForward(const plan::Plan& plan, int32_t rank,
                        const kernels::AttentionShape& shape, const RankBuffers& buffers,
                        transport::Transport* transport, ComputeBackend* backend,
                        absl::Time deadline, uint64_t call_tag, ExecStats* stats,
                        std::function<bool()> cancelled = nullptr);

// Runs rank `rank`'s backward plan: reads q, k, v, o, lse, d_o; writes dq,
// dk, dv. Same contract as RunForward.
absl::Status RunBackward(const plan::Plan& plan, int32_t rank,
                         const kernels::AttentionShape& shape, const RankBuffers& buffers,
                         transport::Transport* transport, ComputeBackend* backend,
                         absl::Time deadline, uint64_t call_tag, ExecStats* stats,
                         std::function<bool()> cancelled = nullptr);

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_EXECUTOR_H_

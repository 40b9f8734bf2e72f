// The row copies that pack a transfer's rows into its contiguous wire form
// or unpack them from it, from the wire layout (plan/wire_layout.h) and the
// rank's memory (rank_memory.h). Internal to the executor.
//
// Where each payload's rows are read (pack, the sender) and written
// (unpack, the receiver):
//   kKv            home K/V              -> lands in place in the receive buffer
//   kQkvHeads      local Q, K, V         -> home Q, K, V
//   kOutLseHeads   O accumulator, home LSE -> local O, LSE
//   kBwdHeads      local Q, O, dO, K, V, LSE -> home Q, O, dO, K, V, LSE
//   kGradQkvHeads  dQ/dK/dV accumulators -> local dQ; local dK/dV fp32 (added)
//   kGradKv        received-rows dK/dV accumulators -> home dK/dV accumulators (added)
#ifndef HSAP_SERVER_EXEC_ROW_COPIES_H_
#define HSAP_SERVER_EXEC_ROW_COPIES_H_

#include <vector>

#include "server/exec/compute_backend.h"
#include "server/exec/rank_layout.h"
#include "server/exec/rank_memory.h"
#include "server/plan/plan.h"

namespace hsap::exec {

// Appends to `out` the copies that move `t`'s rows between the rank's
// memory and `wire` (t.bytes bytes, the rows back to back in segment
// order): from memory to wire when `pack`, else from wire to memory.
// REQUIRES: LayoutFor accepted the plan holding `t`.
void AppendTransferCopies(const RankLayout& layout, const RankMemory& memory,
                          const plan::Transfer& t, bool pack, char* wire,
                          std::vector<RowCopy>* out);

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_ROW_COPIES_H_

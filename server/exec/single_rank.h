// Runs the attention call of a one-rank group: the whole mask on one CPU
// device slot, with the CPU kernels (kernels/cpu). No transfers.
#ifndef HSAP_SERVER_EXEC_SINGLE_RANK_H_
#define HSAP_SERVER_EXEC_SINGLE_RANK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"
#include "server/exec/attention_call.h"

namespace hsap {

struct RunStats {
  uint64_t area = 0;  // allowed (q, k) pairs computed
  double compute_seconds = 0;
};

// REQUIRES: call.group_size == 1 and `call` came from the validation.
// Writes o and lse (forward) or dq, dk, dv (backward) into the call's regions.
absl::Status RunSingleRank(const AttentionCall& call, kernels::cpu::ThreadPool* pool,
                           RunStats* stats);

}  // namespace hsap

#endif  // HSAP_SERVER_EXEC_SINGLE_RANK_H_

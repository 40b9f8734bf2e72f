#include "server/exec/single_rank.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cpu/attention.h"

namespace hsap {

absl::Status RunSingleRank(const AttentionCall& call, kernels::cpu::ThreadPool* pool,
                           RunStats* stats) {
  if (call.group_size != 1) {
    return absl::InternalError(absl::StrCat("RunSingleRank got a group of ", call.group_size));
  }
  const absl::Time start = absl::Now();
  const int64_t t = call.local_tokens;
  if (!call.backward) {
    kernels::cpu::VarlenForward(call.shape, call.q.data, call.k.data, call.v.data, t, t,
                                call.slices, call.o.data, reinterpret_cast<float*>(call.lse.data),
                                pool);
  } else {
    kernels::cpu::VarlenBackward(call.shape, call.q.data, call.k.data, call.v.data, call.o.data,
                                 reinterpret_cast<const float*>(call.lse.data), call.d_o.data, t, t,
                                 call.slices, call.dq.data, call.dk.data, call.dv.data, pool);
  }
  stats->compute_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  stats->area = 0;
  for (const MaskSlice& s : call.slices) stats->area += SliceArea(s);
  return absl::OkStatus();
}

}  // namespace hsap

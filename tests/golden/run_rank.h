// The one place golden_hashes.cc touches the executor's API, so that the
// tool survives a change of that API with an edit here only.
#ifndef HSAP_TESTS_GOLDEN_RUN_RANK_H_
#define HSAP_TESTS_GOLDEN_RUN_RANK_H_

#include <string>
#include <vector>

#include "kernels/attention_params.h"
#include "server/plan/plan.h"

namespace hsap {
namespace kernels {
using AttentionShapeForGolden = AttentionShape;
}  // namespace kernels

namespace golden {

// One rank's tensors, rows in assignment order (executor.h RankBuffers).
struct RankTensors {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const void* d_o;
  void* dq;
  void* dk;
  void* dv;
};

// Runs the plan's forward then backward on one thread per rank over an
// in-process fabric with a 1-thread kernel pool (deterministic); "" when every rank
// succeeded, else the first error.
std::string RunGroup(const plan::Plan& plan, const kernels::AttentionShapeForGolden& shape,
                     const std::vector<RankTensors>& tensors, int kernel_threads = 1);

}  // namespace golden
}  // namespace hsap

#endif  // HSAP_TESTS_GOLDEN_RUN_RANK_H_

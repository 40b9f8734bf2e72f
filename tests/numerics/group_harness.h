// Test harness: one group's forward and backward through the executor
// (server/exec/executor.h), every rank on its own thread and compute
// backend over an in-process fabric, with the outputs gathered back to
// global token order and compared with the float64 reference
// (kernels/cpu/reference.h). Shared by the executor's backend tests
// (tests/gpu:executor_emulation_test) and the numerics tests.
#ifndef HSAP_TESTS_NUMERICS_GROUP_HARNESS_H_
#define HSAP_TESTS_NUMERICS_GROUP_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attention_params.h"
#include "server/exec/compute_backend.h"
#include "server/plan/plan.h"

namespace hsap::testing {

// A whole problem in global token order, inputs in storage dtype.
struct GroupProblem {
  plan::PlanSpec spec;
  kernels::AttentionShape shape;  // softmax_scale resolved
  std::vector<char> q, k, v, d_o;  // [T, H, D] of shape.dtype
};

// Outputs in global token order, widened to double; LSE [Hq, T].
struct GroupOutputs {
  std::vector<double> o, lse, dq, dk, dv;
  std::vector<char> o_storage;  // O as the ranks wrote it, [T, Hq, D] dtype
  absl::Status status;          // the first rank's error, if any
};

// Random inputs: cu_seqlens documents of 1..max_doc tokens (T in total),
// uniform in [-1, 1] (dO too), the given shape and dtype.
GroupProblem RandomProblem(std::mt19937_64& rng, int64_t T, int64_t max_doc, int hq, int hkv,
                           int d, DType dtype);

// One backend per rank.
using BackendFactory = std::function<std::unique_ptr<exec::ComputeBackend>(int32_t rank)>;

// Runs forward then backward of `plan` on `problem`; each rank's tensors in
// its assignment order. `arrival_order`, when given, is the order in which
// the rank threads are started (a permutation of [0, P)).
GroupOutputs RunGroup(const plan::Plan& plan, const GroupProblem& problem,
                      const BackendFactory& backends,
                      const std::vector<int32_t>& arrival_order = {});

// The float64 reference of the problem; the backward takes Delta from
// `o_storage` (the forward's O in storage dtype, as every flash-attention
// backward does) when it is not empty, else from the exact forward.
GroupOutputs Reference(const GroupProblem& problem, const std::vector<char>& o_storage = {});

// max |a - b| / max |b| over finite entries; infinite entries must match
// exactly (else +inf); a NaN in `a` where `b` has none gives +inf.
double RelativeError(const std::vector<double>& a, const std::vector<double>& b);

// The error the dtype's rounding alone makes on `ref` (at least 1e-7).
double RoundingError(const std::vector<double>& ref, DType dtype);

}  // namespace hsap::testing

#endif  // HSAP_TESTS_NUMERICS_GROUP_HARNESS_H_

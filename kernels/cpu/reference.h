// Float64 brute-force attention: the reference every test in HSAP compares
// against. Materialises scores; meant for small and medium cases only.
//
// Inputs are read from storage of `shape.dtype` and widened to double, so a
// bf16/fp16 reference is "the exact answer on the same rounded inputs".
// NaN and infinities follow plain float64 arithmetic (a NaN or +inf score
// makes its row NaN; 0 * inf is NaN), except that a row whose allowed scores
// are all -inf adds nothing, as a masked row (docs/numerics.md).
#ifndef HSAP_KERNELS_CPU_REFERENCE_H_
#define HSAP_KERNELS_CPU_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/mask.h"
#include "kernels/cpu/attention.h"

namespace hsap::kernels::cpu {

// o:   [num_q, Hq, D] (resized); lse: [Hq, num_q] (resized). A row that sees
// no key gets O = 0 and LSE = -inf. Each allowed (q, k) pair counts once even
// if slices overlap.
void ReferenceForward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                      int64_t num_q, int64_t num_k, absl::Span<const MaskSlice> slices,
                      std::vector<double>* o, std::vector<double>* lse);

// dq: [num_q, Hq, D]; dk, dv: [num_k, Hkv, D] (resized). Recomputes the
// forward internally from q, k, v.
void ReferenceBackward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                       const void* dout, int64_t num_q, int64_t num_k,
                       absl::Span<const MaskSlice> slices, std::vector<double>* dq,
                       std::vector<double>* dk, std::vector<double>* dv);

// As ReferenceBackward, but Delta = rowsum(dO * O) is taken from the given
// forward output `o` ([num_q, Hq, D], shape.dtype) the way every
// flash-attention backward does, instead of from the exact forward. For
// bf16/fp16 this is "the exact answer on the same rounded inputs" of a
// backward kernel, whose inputs include O rounded to the storage type.
void ReferenceBackwardFromOutput(const AttentionShape& shape, const void* q, const void* k,
                                 const void* v, const void* o, const void* dout, int64_t num_q,
                                 int64_t num_k, absl::Span<const MaskSlice> slices,
                                 std::vector<double>* dq, std::vector<double>* dk,
                                 std::vector<double>* dv);

// max |a - b| / max(max |b|, tiny): the relative error measure used by tests.
double MaxRelativeError(absl::Span<const double> actual, absl::Span<const double> expected);

}  // namespace hsap::kernels::cpu

#endif  // HSAP_KERNELS_CPU_REFERENCE_H_

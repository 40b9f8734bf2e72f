// CPU attention kernels: the work items of a plan (DESIGN.md §2, §6).
//
// A work item is one Q range against one K/V range under one mask rule
// (common/mask.h). Forward items merge their partial (O, LSE) into fp32
// accumulators with log-sum-exp; backward items add dQ/dK/dV contributions
// into fp32 accumulators. The executor (or VarlenForward/VarlenBackward for a
// single rank) owns the accumulators and casts them to the output dtype.
//
// Tensor layout (flash-attention varlen): a token row holds all heads,
// Q/O/dQ/dO: [tokens, Hq, D], K/V/dK/dV: [tokens, Hkv, D], LSE: [Hq, tokens]
// fp32 natural log. GQA: query head h reads kv head h / (Hq / Hkv).
//
// Numerics: storage fp32/bf16/fp16, accumulation fp32. A query row that sees
// no key has LSE = -inf and O = 0; merging it with anything is exact and never
// produces NaN. NaN and infinities in the inputs propagate as in a dense
// float64 softmax over the allowed pairs (docs/numerics.md): an item whose
// inputs are not all finite runs on float64 tiles that touch allowed pairs
// only, so masked-out pairs never contaminate. Results are bitwise
// deterministic: the same inputs give the same bits whatever the pool's size
// (accumulators receive their contributions in a fixed order).
//
// Example (one rank, packed causal documents):
//   ThreadPool pool(2);
//   AttentionShape shape{Hq, Hkv, D, DType::kBFloat16, 1.0f / std::sqrt(D)};
//   auto slices = LowerDocuments(cu_seqlens, /*causal=*/true, /*window=*/-1);
//   VarlenForward(shape, q, k, v, T, T, slices, o, lse, &pool);
#ifndef HSAP_KERNELS_CPU_ATTENTION_H_
#define HSAP_KERNELS_CPU_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/mask.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/thread_pool.h"

namespace hsap::kernels::cpu {

// The kernels' contract (kernels/attention_params.h), shared with the CUDA
// backend. Here: any head dim the entry points accept, storage fp32, bf16 or
// fp16.
using ::hsap::kernels::AttentionShape;
using ::hsap::kernels::BwdWorkItem;
using ::hsap::kernels::FwdWorkItem;

// Runs `items` in parallel on `pool` (nullptr: calling thread only). Items
// may write the same accumulator rows; the result is merging them one after
// another in a fixed order (the same on every run). Never materialises the
// full score matrix: online softmax over key blocks (FlashAttention-2).
// REQUIRES: shape validated; every item's ranges inside its buffers.
//
// `stop` (may be null) is asked between waves of tiles (a few milliseconds
// of work each) whether to give up — a passed deadline or a cancelled call;
// Forward then returns false with the accumulators partly merged.
using StopFn = std::function<bool()>;
bool Forward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items, ThreadPool* pool,
             const StopFn* stop = nullptr);

// Runs `items` on `pool`. Items may share dq/dk/dv rows; the sums are formed
// in a fixed order (the same on every run, whatever the pool).
// `stop` as for Forward.
bool Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items, ThreadPool* pool,
              const StopFn* stop = nullptr);

// delta[h * lse_stride + t] = sum_d dout[t, h, d] * o[t, h, d] (fp32),
// for t in [0, num_tokens).
void ComputeDelta(const AttentionShape& shape, const void* o, const void* dout,
                  int64_t num_tokens, float* delta, int64_t lse_stride, ThreadPool* pool);

// Merges partial (o_b, lse_b) into (o_a, lse_a) for `num_rows` rows of
// `num_heads` heads: lse = logaddexp(lse_a, lse_b), o = weighted sum. Rows
// with both LSE = -inf stay O = 0, LSE = -inf.
void MergePartial(int num_heads, int head_dim, int64_t num_rows, float* o_a, float* lse_a,
                  const float* o_b, const float* lse_b, int64_t lse_stride);

// Converts an fp32 buffer of n elements to `dtype` (round to nearest even).
void CastFromFloat(const float* src, int64_t n, DType dtype, void* dst, ThreadPool* pool);

// The kernels' scratch (packed operands, partial results, the Varlen
// functions' fp32 accumulators): blocks of 1 MiB or more are kept when a
// call ends, for the next call to reuse, up to `bytes` of free blocks in all
// (the oldest go first; 0 keeps none). The default is 512 MiB; hsapd sets
// --kernel_scratch_cache_bytes. Reusing a block saves faulting in its pages
// again (kernels/cpu/scratch.h). Thread-safe.
void SetScratchCacheLimit(size_t bytes);
// Bytes of free scratch blocks held now.
size_t ScratchCacheBytes();

// Single-rank packed attention, the whole call: Q rows [0, num_q) against K/V
// rows [0, num_k) under `slices` (validated by the caller).
//   o:   [num_q, Hq, D] dtype (written)
//   lse: [Hq, num_q] fp32 (written)
void VarlenForward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                   int64_t num_q, int64_t num_k, absl::Span<const MaskSlice> slices, void* o,
                   float* lse, ThreadPool* pool);

//   o, dout: [num_q, Hq, D] dtype; lse: [Hq, num_q] from VarlenForward
//   dq: [num_q, Hq, D], dk/dv: [num_k, Hkv, D] dtype (written)
void VarlenBackward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                    const void* o, const float* lse, const void* dout, int64_t num_q,
                    int64_t num_k, absl::Span<const MaskSlice> slices, void* dq, void* dk,
                    void* dv, ThreadPool* pool);

}  // namespace hsap::kernels::cpu

#endif  // HSAP_KERNELS_CPU_ATTENTION_H_

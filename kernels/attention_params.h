// The kernels' contract: one plain params struct per kind of call, shared by
// every compute backend (kernels/cpu for the CPU, kernels/cuda for GPUs) and
// by the executor that fills them (FlashAttention's single params struct).
//
// A work item is one Q range against one K/V range under one mask rule
// (common/mask.h). Forward items merge their partial (O, LSE) into fp32
// accumulators with log-sum-exp; backward items add dQ/dK/dV contributions
// into fp32 accumulators. The caller owns the accumulators and casts them
// to the storage dtype once.
//
// Tensor layout (flash-attention varlen): a token row holds all heads,
// Q/O/dQ/dO: [tokens, Hq, D], K/V/dK/dV: [tokens, Hkv, D], LSE: [Hq, tokens]
// fp32 natural log. GQA: query head h reads kv head h / (Hq / Hkv).
//
// Pointers are host pointers for the CPU backend and device pointers for
// the CUDA backend; what each backend supports (dtypes, head dims) is in
// its own header.
#ifndef HSAP_KERNELS_ATTENTION_PARAMS_H_
#define HSAP_KERNELS_ATTENTION_PARAMS_H_

#include <cstdint>

#include "common/dtype.h"
#include "common/mask.h"

namespace hsap::kernels {

// What every tensor of one call shares.
struct AttentionShape {
  int num_heads_q = 0;   // Hq
  int num_heads_kv = 0;  // Hkv; Hq % Hkv == 0
  int head_dim = 0;      // D
  DType dtype = DType::kFloat32;  // storage type of Q, K, V, O, dO, dQ, dK, dV
  float softmax_scale = 0.f;      // usually 1/sqrt(D)
};

// One forward work item. Pointers address the first row of each range; row
// strides are in elements and default (0) to H * D of that tensor.
struct FwdWorkItem {
  const void* q = nullptr;  // [num_q, Hq, D] dtype
  const void* k = nullptr;  // [num_k, Hkv, D] dtype
  const void* v = nullptr;  // [num_k, Hkv, D] dtype
  int64_t num_q = 0;
  int64_t num_k = 0;
  int64_t q_row_stride = 0;
  int64_t kv_row_stride = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;   // CAUSAL diagonal offset (common/mask.h)
  int64_t window = -1;  // CAUSAL window, < 0 for none
  // Accumulators, merged into (not overwritten). Start them at O = 0,
  // LSE = -inf. o_acc holds the *normalised* partial output.
  float* o_acc = nullptr;    // [num_q, Hq, D] fp32, row stride Hq * D
  float* lse_acc = nullptr;  // [Hq, lse_stride] fp32, column 0 = first row
  int64_t lse_stride = 0;
};

// One backward work item: adds this slice's contributions to dQ, dK, dV.
struct BwdWorkItem {
  const void* q = nullptr;       // [num_q, Hq, D] dtype
  const void* k = nullptr;       // [num_k, Hkv, D] dtype
  const void* v = nullptr;       // [num_k, Hkv, D] dtype
  const void* dout = nullptr;    // [num_q, Hq, D] dtype
  const float* lse = nullptr;    // [Hq, lse_stride], the final forward LSE of these rows
  const float* delta = nullptr;  // [Hq, lse_stride], rowsum(dO * O) (ComputeDelta)
  int64_t lse_stride = 0;
  int64_t num_q = 0;
  int64_t num_k = 0;
  int64_t q_row_stride = 0;   // for q and dout
  int64_t kv_row_stride = 0;  // for k and v
  MaskType type = MaskType::kFull;
  int64_t offset = 0;
  int64_t window = -1;
  float* dq_acc = nullptr;  // [num_q, Hq, D] fp32, +=
  float* dk_acc = nullptr;  // [num_k, Hkv, D] fp32, +=
  float* dv_acc = nullptr;  // [num_k, Hkv, D] fp32, +=
};

enum class CopyOp : uint8_t {
  kCopy,        // `elems` bytes per row, as they are
  kStoreFloat,  // fp32 source -> `dtype` destination, round to nearest even
  kAddLoaded,   // destination (fp32) += float(source of `dtype`)
};

// One strided row copy: `rows` rows; row r reads src + r * src_stride and
// writes dst + r * dst_stride (strides in bytes); each row is `elems`
// elements (bytes for kCopy). The executor packs and unpacks transfers,
// uploads and downloads with lists of these.
struct RowCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t rows = 0;
  int64_t src_stride = 0;
  int64_t dst_stride = 0;
  int64_t elems = 0;
  CopyOp op = CopyOp::kCopy;
  DType dtype = DType::kFloat32;
};

}  // namespace hsap::kernels

#endif  // HSAP_KERNELS_ATTENTION_PARAMS_H_

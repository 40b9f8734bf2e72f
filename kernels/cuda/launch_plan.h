// Launch plans of the CUDA attention kernels (internal, host-only, no CUDA
// dependency): the argument checks of the entry points, and the plan a
// launch executes: items with resolved strides, the flattened tile table
// and, for the forward, the waves. attention_fwd.cu / attention_bwd.cu
// upload and launch a plan; tests/gpu/kernel_emulation_test.cc runs the
// same plans through the kernels on the CPU.
#ifndef HSAP_KERNELS_CUDA_LAUNCH_PLAN_H_
#define HSAP_KERNELS_CUDA_LAUNCH_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/tiling.h"

namespace hsap::kernels::cuda::internal {

// dtype bf16/fp16 and head_dim 64/128/256, heads positive with Hq % Hkv == 0.
inline absl::Status ValidateShape(const AttentionShape& s) {
  if (s.dtype != DType::kBFloat16 && s.dtype != DType::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype: ", DTypeName(s.dtype),
        " is not supported by the CUDA kernels (bfloat16, float16; fp32 runs on the CPU)"));
  }
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim: ", s.head_dim, " is not supported by the CUDA kernels (64, 128, 256)"));
  }
  if (s.num_heads_q <= 0 || s.num_heads_kv <= 0 || s.num_heads_q % s.num_heads_kv != 0 ||
      s.num_heads_q > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads_q/num_heads_kv: ", s.num_heads_q,
                                                   "/", s.num_heads_kv,
                                                   " (need 0 < Hkv, Hq % Hkv == 0, Hq <= 65535)"));
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT naming items[i].field when `p` is not 16-byte aligned.
inline absl::Status CheckAligned(const void* p, size_t i, const char* field) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("items[", i, "].", field, ": device pointer not 16-byte aligned"));
  }
  return absl::OkStatus();
}

inline absl::Status CheckStride(int64_t stride, int64_t min, size_t i, const char* field) {
  if (stride % 8 != 0 || stride < min) {
    return absl::InvalidArgumentError(absl::StrCat("items[", i, "].", field, ": ", stride,
                                                   " (need a multiple of 8, >= ", min, ")"));
  }
  return absl::OkStatus();
}

// The forward launches: items (strides resolved), tiles of all waves back
// to back, wave w's tiles at [wave_begin[w], wave_begin[w + 1]).
struct ForwardPlan {
  std::vector<FwdWorkItem> items;
  std::vector<TileRef> tiles;
  std::vector<size_t> wave_begin;  // one more entry than waves
};

// Validates `shape` and `items` (INVALID_ARGUMENT naming the field) and
// plans the forward launches with Q blocks of `block_q` rows.
inline absl::Status PlanForward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items,
                                int block_q, ForwardPlan* plan) {
  HSAP_RETURN_IF_ERROR(ValidateShape(shape));
  const int D = shape.head_dim;
  std::vector<FwdWorkItem>& resolved = plan->items;
  resolved.assign(items.begin(), items.end());
  std::vector<SliceGeometry> geometry;
  std::vector<AccumulatorSpan> spans;
  for (size_t i = 0; i < resolved.size(); ++i) {
    FwdWorkItem& it = resolved[i];
    if (it.q_row_stride == 0) it.q_row_stride = static_cast<int64_t>(shape.num_heads_q) * D;
    if (it.kv_row_stride == 0) it.kv_row_stride = static_cast<int64_t>(shape.num_heads_kv) * D;
    if (it.num_q < 0 || it.num_k < 0 || it.num_q >= (int64_t{1} << 31) - 1024 ||
        it.num_k >= (int64_t{1} << 31) - 1024) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "].num_q/num_k: ", it.num_q,
                                                     "/", it.num_k));
    }
    if (it.num_q > 0 && it.num_k > 0) {
      HSAP_RETURN_IF_ERROR(CheckAligned(it.q, i, "q"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.k, i, "k"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.v, i, "v"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.o_acc, i, "o_acc"));
      if (it.lse_acc == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("items[", i, "].lse_acc: null"));
      }
      HSAP_RETURN_IF_ERROR(
          CheckStride(it.q_row_stride, int64_t{shape.num_heads_q} * D, i, "q_row_stride"));
      HSAP_RETURN_IF_ERROR(
          CheckStride(it.kv_row_stride, int64_t{shape.num_heads_kv} * D, i, "kv_row_stride"));
      if (shape.num_heads_q > 1 && it.lse_stride < it.num_q) {
        return absl::InvalidArgumentError(absl::StrCat("items[", i, "].lse_stride: ",
                                                       it.lse_stride, " < num_q ", it.num_q));
      }
    }
    geometry.push_back({it.num_q, it.num_k, it.type, it.offset, it.window});
    AccumulatorSpan span;
    if (it.num_q > 0 && it.num_k > 0) {
      span.o_begin = reinterpret_cast<uintptr_t>(it.o_acc);
      span.o_end = span.o_begin + it.num_q * shape.num_heads_q * D * sizeof(float);
      span.lse_begin = reinterpret_cast<uintptr_t>(it.lse_acc);
      span.lse_end = span.lse_begin + it.num_q * sizeof(float);
    }
    spans.push_back(span);
  }
  const std::vector<int> wave_of = AssignWaves(spans);
  int num_waves = 0;
  for (int w : wave_of) num_waves = std::max(num_waves, w + 1);
  std::vector<TileRef>& tiles = plan->tiles;
  std::vector<size_t>& wave_begin = plan->wave_begin;
  tiles.clear();
  wave_begin.clear();
  for (int w = 0; w < num_waves; ++w) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < wave_of.size(); ++i) {
      if (wave_of[i] == w) ids.push_back(static_cast<int32_t>(i));
    }
    wave_begin.push_back(tiles.size());
    const std::vector<TileRef> wave_tiles = BuildForwardTiles(geometry, ids, block_q);
    tiles.insert(tiles.end(), wave_tiles.begin(), wave_tiles.end());
  }
  wave_begin.push_back(tiles.size());
  return absl::OkStatus();
}

// The backward launch: items (strides resolved) and tiles.
struct BackwardPlan {
  std::vector<BwdWorkItem> items;
  std::vector<TileRef> tiles;
};

// Validates and plans the backward launch with key blocks of `block_k`.
inline absl::Status PlanBackward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
                                 int block_k, BackwardPlan* plan) {
  HSAP_RETURN_IF_ERROR(ValidateShape(shape));
  const int D = shape.head_dim;
  std::vector<BwdWorkItem>& resolved = plan->items;
  resolved.assign(items.begin(), items.end());
  std::vector<SliceGeometry> geometry;
  for (size_t i = 0; i < resolved.size(); ++i) {
    BwdWorkItem& it = resolved[i];
    if (it.q_row_stride == 0) it.q_row_stride = static_cast<int64_t>(shape.num_heads_q) * D;
    if (it.kv_row_stride == 0) it.kv_row_stride = static_cast<int64_t>(shape.num_heads_kv) * D;
    if (it.num_q < 0 || it.num_k < 0 || it.num_k > (int64_t{1} << 30) * block_k) {
      return absl::InvalidArgumentError(absl::StrCat("items[", i, "].num_q/num_k: ", it.num_q,
                                                     "/", it.num_k));
    }
    if (it.num_q > 0 && it.num_k > 0) {
      HSAP_RETURN_IF_ERROR(CheckAligned(it.q, i, "q"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.k, i, "k"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.v, i, "v"));
      HSAP_RETURN_IF_ERROR(CheckAligned(it.dout, i, "dout"));
      HSAP_RETURN_IF_ERROR(
          CheckStride(it.q_row_stride, int64_t{shape.num_heads_q} * D, i, "q_row_stride"));
      HSAP_RETURN_IF_ERROR(
          CheckStride(it.kv_row_stride, int64_t{shape.num_heads_kv} * D, i, "kv_row_stride"));
      if (it.lse == nullptr || it.delta == nullptr || it.dq_acc == nullptr ||
          it.dk_acc == nullptr || it.dv_acc == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "]: lse, delta, dq_acc, dk_acc and dv_acc are required"));
      }
    }
    geometry.push_back({it.num_q, it.num_k, it.type, it.offset, it.window});
  }
  plan->tiles = BuildBackwardTiles(geometry, block_k);
  return absl::OkStatus();
}

}  // namespace hsap::kernels::cuda::internal

#endif  // HSAP_KERNELS_CUDA_LAUNCH_PLAN_H_

// Host side of the forward kernel: argument checks, tile tables, launches.
// The kernel itself is in forward_kernel.cuh.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/exact_kernels.cuh"
#include "kernels/cuda/forward_kernel.cuh"
#include "kernels/cuda/fragment_layout.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tiling.h"

namespace hsap::kernels::cuda {
namespace {

using namespace kernel;  // NOLINT: the kernels and their traits

template <typename T, int D>
absl::Status LaunchForward(const FwdParams& params, int num_tiles, int num_heads_q,
                           cudaStream_t stream) {
  if (num_tiles == 0) return absl::OkStatus();
  constexpr int kSmem = FwdTraits<D>::kSmemBytes;
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      ForwardKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  ForwardKernel<T, D><<<dim3(num_tiles, num_heads_q), kFwdThreads, kSmem, stream>>>(params);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// The scan of the items' inputs into `exact` (zeroed), one block per
// (item, tensor).
template <typename T>
absl::Status LaunchForwardScan(const AttentionShape& shape, const FwdWorkItem* items,
                               int num_items, uint8_t* exact, cudaStream_t stream) {
  ScanForwardKernel<T><<<dim3(num_items, kScanForwardTensors), kScanThreads, 0, stream>>>(
      items, shape.num_heads_q, shape.num_heads_kv, shape.head_dim, exact);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

// One exact launch per item, in item order, after the fast waves; each
// returns at once unless the scan flagged its item.
template <typename T>
absl::Status LaunchForwardExact(const AttentionShape& shape,
                                const std::vector<FwdWorkItem>& resolved,
                                const FwdWorkItem* items, const uint8_t* exact,
                                cudaStream_t stream) {
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i].num_q <= 0 || resolved[i].num_k <= 0) continue;
    const ExactParams params{items,          exact,           static_cast<int>(i),
                             shape.num_heads_q, shape.num_heads_kv, shape.head_dim,
                             static_cast<double>(shape.softmax_scale)};
    const int blocks = ExactBlocks(resolved[i].num_q * shape.num_heads_q);
    ExactForwardKernel<T><<<blocks, kExactThreads, 0, stream>>>(params);
    HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchForwardD(int head_dim, const FwdParams& params, int num_tiles,
                            int num_heads_q, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return LaunchForward<T, 64>(params, num_tiles, num_heads_q, stream);
    case 128: return LaunchForward<T, 128>(params, num_tiles, num_heads_q, stream);
    default: return LaunchForward<T, 256>(params, num_tiles, num_heads_q, stream);
  }
}

}  // namespace

absl::Status Forward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items,
                     CudaStream stream) {
  internal::ForwardPlan plan;
  HSAP_RETURN_IF_ERROR(internal::PlanForward(shape, items, ForwardBlockQ(shape.head_dim), &plan));
  if (plan.tiles.empty()) return absl::OkStatus();
  const int D = shape.head_dim;
  const std::vector<FwdWorkItem>& resolved = plan.items;
  const std::vector<TileRef>& tiles = plan.tiles;
  const std::vector<size_t>& wave_begin = plan.wave_begin;
  const int num_waves = static_cast<int>(wave_begin.size()) - 1;
  std::vector<uint8_t> table;
  const size_t items_at = internal::AppendTable(resolved, &table);
  const size_t tiles_at = internal::AppendTable(tiles, &table);
  // The scan's flags travel as zeros with the tables (no memset, no sync).
  const size_t exact_at = internal::AppendTable(std::vector<uint8_t>(resolved.size(), 0), &table);
  internal::StreamScratch scratch(stream);
  HSAP_RETURN_IF_ERROR(scratch.Upload(table));
  const bool bf16 = shape.dtype == DType::kBFloat16;
  uint8_t* exact = scratch.MutableAt<uint8_t>(exact_at);
  const int num_items = static_cast<int>(resolved.size());
  HSAP_RETURN_IF_ERROR(
      bf16 ? LaunchForwardScan<__nv_bfloat16>(shape, scratch.At<FwdWorkItem>(items_at),
                                              num_items, exact, stream)
           : LaunchForwardScan<__half>(shape, scratch.At<FwdWorkItem>(items_at), num_items,
                                       exact, stream));
  for (int w = 0; w < num_waves; ++w) {
    FwdParams params;
    params.items = scratch.At<FwdWorkItem>(items_at);
    params.tiles = scratch.At<TileRef>(tiles_at) + wave_begin[w];
    params.num_heads_q = shape.num_heads_q;
    params.group = shape.num_heads_q / shape.num_heads_kv;
    params.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
    params.exact = exact;
    const int num_tiles = static_cast<int>(wave_begin[w + 1] - wave_begin[w]);
    if (bf16) {
      HSAP_RETURN_IF_ERROR(
          LaunchForwardD<__nv_bfloat16>(D, params, num_tiles, shape.num_heads_q, stream));
    } else {
      HSAP_RETURN_IF_ERROR(
          LaunchForwardD<__half>(D, params, num_tiles, shape.num_heads_q, stream));
    }
  }
  return bf16 ? LaunchForwardExact<__nv_bfloat16>(shape, resolved,
                                                  scratch.At<FwdWorkItem>(items_at), exact, stream)
              : LaunchForwardExact<__half>(shape, resolved, scratch.At<FwdWorkItem>(items_at),
                                           exact, stream);
}

}  // namespace hsap::kernels::cuda

// Host side of the backward kernel: argument checks, tile tables, launches.
// The kernel itself is in backward_kernel.cuh.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/backward_kernel.cuh"
#include "kernels/cuda/exact_kernels.cuh"
#include "kernels/cuda/fragment_layout.h"
#include "kernels/cuda/launch_util.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tiling.h"

namespace hsap::kernels::cuda {
namespace {

using namespace kernel;  // NOLINT: the kernels and their traits

template <typename T, int D>
absl::Status LaunchBackward(const BwdParams& params, int num_tiles, int num_heads_q,
                            cudaStream_t stream) {
  using Traits = BwdTraits<D>;
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      BackwardKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  BackwardKernel<T, D>
      <<<dim3(num_tiles, num_heads_q), Traits::kThreads, Traits::kSmemBytes, stream>>>(params);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

template <typename T>
absl::Status LaunchBackwardD(int head_dim, const BwdParams& params, int num_tiles,
                             int num_heads_q, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return LaunchBackward<T, 64>(params, num_tiles, num_heads_q, stream);
    case 128: return LaunchBackward<T, 128>(params, num_tiles, num_heads_q, stream);
    default: return LaunchBackward<T, 256>(params, num_tiles, num_heads_q, stream);
  }
}

// The scan of the items' inputs into `exact` (zeroed), the fast launch
// (which skips flagged items), then one exact launch per item in item
// order (each returns at once unless its item is flagged).
template <typename T>
absl::Status LaunchBackwardAll(const AttentionShape& shape, const BwdParams& params,
                               const std::vector<BwdWorkItem>& resolved, int num_tiles,
                               uint8_t* exact, cudaStream_t stream) {
  const int num_items = static_cast<int>(resolved.size());
  ScanBackwardKernel<T><<<dim3(num_items, kScanBackwardTensors), kScanThreads, 0, stream>>>(
      params.items, shape.num_heads_q, shape.num_heads_kv, shape.head_dim, exact);
  HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  HSAP_RETURN_IF_ERROR(
      LaunchBackwardD<T>(shape.head_dim, params, num_tiles, shape.num_heads_q, stream));
  for (int i = 0; i < num_items; ++i) {
    if (resolved[i].num_q <= 0 || resolved[i].num_k <= 0) continue;
    const ExactParams exact_params{params.items,      exact,           i,
                                   shape.num_heads_q, shape.num_heads_kv, shape.head_dim,
                                   static_cast<double>(shape.softmax_scale)};
    const int blocks = ExactBlocks(resolved[i].num_q * shape.num_heads_q);
    ExactBackwardKernel<T><<<blocks, kExactThreads, 0, stream>>>(exact_params);
    HSAP_KERNEL_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
                      CudaStream stream) {
  internal::BackwardPlan plan;
  HSAP_RETURN_IF_ERROR(internal::PlanBackward(shape, items, kBwdBlockK, &plan));
  if (plan.tiles.empty()) return absl::OkStatus();
  const std::vector<BwdWorkItem>& resolved = plan.items;
  const std::vector<TileRef>& tiles = plan.tiles;
  std::vector<uint8_t> table;
  const size_t items_at = internal::AppendTable(resolved, &table);
  const size_t tiles_at = internal::AppendTable(tiles, &table);
  // The scan's flags travel as zeros with the tables (no memset, no sync).
  const size_t exact_at = internal::AppendTable(std::vector<uint8_t>(resolved.size(), 0), &table);
  internal::StreamScratch scratch(stream);
  HSAP_RETURN_IF_ERROR(scratch.Upload(table));
  BwdParams params;
  params.items = scratch.At<BwdWorkItem>(items_at);
  params.tiles = scratch.At<TileRef>(tiles_at);
  params.num_heads_q = shape.num_heads_q;
  params.num_heads_kv = shape.num_heads_kv;
  params.group = shape.num_heads_q / shape.num_heads_kv;
  params.scale = shape.softmax_scale;
  params.scale_log2 = shape.softmax_scale * 1.4426950408889634f;
  uint8_t* exact = scratch.MutableAt<uint8_t>(exact_at);
  params.exact = exact;
  const int num_tiles = static_cast<int>(tiles.size());
  if (shape.dtype == DType::kBFloat16) {
    return LaunchBackwardAll<__nv_bfloat16>(shape, params, resolved, num_tiles, exact, stream);
  }
  return LaunchBackwardAll<__half>(shape, params, resolved, num_tiles, exact, stream);
}

}  // namespace hsap::kernels::cuda

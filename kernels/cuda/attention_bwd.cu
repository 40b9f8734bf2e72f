// Host side of the backward kernel: argument checks, tile tables, launches.
// The kernel itself is in backward_kernel.cuh.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/backward_kernel.cuh"
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

}  // namespace

absl::Status Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
                      CudaStream stream) {
  internal::BackwardPlan plan;
  HSAP_RETURN_IF_ERROR(internal::PlanBackward(shape, items, kBwdBlockK, &plan));
  if (plan.tiles.empty()) return absl::OkStatus();
  const int D = shape.head_dim;
  const std::vector<BwdWorkItem>& resolved = plan.items;
  const std::vector<TileRef>& tiles = plan.tiles;
  std::vector<uint8_t> table;
  const size_t items_at = internal::AppendTable(resolved, &table);
  const size_t tiles_at = internal::AppendTable(tiles, &table);
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
  const int num_tiles = static_cast<int>(tiles.size());
  if (shape.dtype == DType::kBFloat16) {
    return LaunchBackwardD<__nv_bfloat16>(D, params, num_tiles, shape.num_heads_q, stream);
  }
  return LaunchBackwardD<__half>(D, params, num_tiles, shape.num_heads_q, stream);
}

}  // namespace hsap::kernels::cuda

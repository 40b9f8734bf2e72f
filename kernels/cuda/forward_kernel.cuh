// Forward attention work items on the GPU (FlashAttention-2 structure).
//
// One CTA of 4 warps per (tile = (item, Q block of 128 rows, 64 for
// D = 256), query head). The Q block is copied to shared memory once; the
// K/V blocks its rows can see (QBlockKeyRange) stream through a double
// buffer filled by cp.async while the previous block is computed. Each warp
// owns 32 query rows (16 for D = 256):
//   S = Q·K^T           mma.sync m16n8k16, fp32 accumulators in registers
//   mask                only on blocks that are not interior (BlockIsInterior)
//   online softmax      fp32, log2 domain, running max and per-lane row sums
//   O = α∘O + P·V       P re-packed from the S registers to 16 bits (no smem)
// and the normalised partial (O, LSE) is merged into the caller's fp32
// accumulators with the log-sum-exp rule. Items whose accumulators overlap
// run in separate waves (tiling.h AssignWaves), so a merge never races.
//
// -inf handling: a row that has seen no allowed key keeps max = -inf; the
// exponent subtrahend is then 0, so exp2(-inf - 0) = 0 and no inf - inf is
// ever formed. A row that sees no key in the whole item ends with row sum 0:
// its partial LSE is -inf and the merge leaves the accumulator untouched.
//
// The forward kernel: included by attention_fwd.cu (nvcc) and by the CPU
// emulation test (tests/gpu/kernel_emulation_test.cc).
#ifndef HSAP_KERNELS_CUDA_FORWARD_KERNEL_CUH_
#define HSAP_KERNELS_CUDA_FORWARD_KERNEL_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/fragment_layout.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tiling.h"

namespace hsap::kernels::cuda::kernel {

constexpr int kFwdWarps = 4;
constexpr int kFwdThreads = kFwdWarps * 32;

// Compile-time tile choices per head dim. Each warp owns kMTiles 16-row
// m-tiles, so every K/V fragment it loads from shared memory feeds kMTiles
// mma's (2 for D <= 128, as FlashAttention-2's 128-row blocks; 1 for D = 256,
// where O alone takes 128 registers). Smaller key blocks for D = 256 keep the
// S registers and the K/V double buffer within budget.
template <int D>
struct FwdTraits {
  static constexpr int kMTiles = D <= 128 ? 2 : 1;
  static constexpr int kBlockQ = kFwdWarps * 16 * kMTiles;
  static constexpr int kBlockK = D <= 128 ? 64 : 32;
  static constexpr int kSmemStride = D + 8;  // +16 bytes: conflict-free ldmatrix rows
  static constexpr int kSmemBytes = (kBlockQ + 4 * kBlockK) * kSmemStride * 2;
};

// The query rows per forward tile for head dim D (the tile table's block).
inline int ForwardBlockQ(int head_dim) {
  switch (head_dim) {
    case 64: return FwdTraits<64>::kBlockQ;
    case 128: return FwdTraits<128>::kBlockQ;
    default: return FwdTraits<256>::kBlockQ;
  }
}

struct FwdParams {
  const FwdWorkItem* items;  // strides already resolved (non-zero)
  const TileRef* tiles;      // this wave's tiles
  int num_heads_q;
  int group;          // Hq / Hkv
  float scale_log2;   // softmax_scale * log2(e)
  // One flag per item (exact_kernels.cuh's scan): tiles of flagged items
  // return at once, the exact kernels compute them. Null: none flagged.
  const uint8_t* exact = nullptr;
};

template <typename T, int D>
__global__ void __launch_bounds__(kFwdThreads) ForwardKernel(FwdParams p) {
  using Traits = FwdTraits<D>;
  using E = device::ElementTraits<T>;
  constexpr int kBQ = Traits::kBlockQ;
  constexpr int kBK = Traits::kBlockK;
  constexpr int kMT = Traits::kMTiles;
  constexpr int kS = Traits::kSmemStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);  // [kBQ][kS]
  T* k_s = q_s + kBQ * kS;                  // [2][kBK][kS]
  T* v_s = k_s + 2 * kBK * kS;              // [2][kBK][kS]

  const TileRef tile = p.tiles[blockIdx.x];
  if (p.exact != nullptr && p.exact[tile.item]) return;  // the exact kernels' item
  const FwdWorkItem& item = p.items[tile.item];
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const SliceGeometry geo{item.num_q, item.num_k, item.type, item.offset, item.window};
  const int64_t row0 = static_cast<int64_t>(tile.block) * kBQ;
  int64_t key_begin, key_end;
  QBlockKeyRange(geo, row0, row0 + kBQ, &key_begin, &key_end);
  if (key_begin >= key_end) return;  // BuildForwardTiles leaves these out

  const int64_t q_stride = item.q_row_stride;
  const int64_t kv_stride = item.kv_row_stride;
  const T* q = static_cast<const T*>(item.q) + row0 * q_stride + head * D;
  const T* k = static_cast<const T*>(item.k) + key_begin * kv_stride + kv_head * D;
  const T* v = static_cast<const T*>(item.v) + key_begin * kv_stride + kv_head * D;
  const int64_t num_keys = key_end - key_begin;
  const int num_blocks = static_cast<int>(CeilBlocks(num_keys, kBK));

  device::LoadTileAsync<T, kBQ, D, kS, kFwdThreads>(q_s, q, q_stride, item.num_q - row0);
  auto load_kv = [&](int n, int buf) {
    const int64_t first = static_cast<int64_t>(n) * kBK;
    device::LoadTileAsync<T, kBK, D, kS, kFwdThreads>(k_s + buf * kBK * kS, k + first * kv_stride,
                                                      kv_stride, num_keys - first);
    device::LoadTileAsync<T, kBK, D, kS, kFwdThreads>(v_s + buf * kBK * kS, v + first * kv_stride,
                                                      kv_stride, num_keys - first);
  };
  load_kv(0, 0);
  device::CpAsyncCommit();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // ldmatrix row addresses (fragment_layout.h), fixed for the whole CTA.
  const LaneRowCol q_lane = LdmRowMajorA(lane), k_lane = LdmBPair(lane),
                   v_lane = LdmTransBPair(lane);
  const int warp_row0 = warp * 16 * kMT;  // first block row of this warp
  const int64_t rows_valid_end = row0 + kBQ < geo.num_q ? row0 + kBQ : geo.num_q;

  float o[kMT][D / 8][4];
  float row_max[kMT][2], row_sum[kMT][2];  // row_sum: this lane's share, summed at the end
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.f;
  }

  for (int n = 0; n < num_blocks; ++n) {
    if (n + 1 < num_blocks) {
      load_kv(n + 1, (n + 1) & 1);
      device::CpAsyncCommit();
      device::CpAsyncWait<1>();
    } else {
      device::CpAsyncWait<0>();
    }
    __syncthreads();
    const T* kt = k_s + (n & 1) * kBK * kS;
    const T* vt = v_s + (n & 1) * kBK * kS;

    // S = Q·K^T for this warp's rows and the block's kBK keys; each K
    // fragment feeds all kMT m-tiles.
    float s[kMT][kBK / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int j = 0; j < kBK / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        device::LdMatrixX4(a[mt],
                           q_s + (warp_row0 + mt * 16 + q_lane.row) * kS + kk * 16 + q_lane.col);
      }
#pragma unroll
      for (int j = 0; j < kBK / 8; j += 2) {
        uint32_t b[4];
        device::LdMatrixX4(b, kt + (j * 8 + k_lane.row) * kS + kk * 16 + k_lane.col);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          E::Mma(s[mt][j], a[mt], b);
          E::Mma(s[mt][j + 1], a[mt], b + 2);
        }
      }
    }

    const int64_t kb = key_begin + static_cast<int64_t>(n) * kBK;
    const bool interior = BlockIsInterior(geo, row0, rows_valid_end, kb, kb + kBK);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int j = 0; j < kBK / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][j][e] *= p.scale_log2;
      }
    }
    if (!interior) {
      // Edge block: keep the keys [lo, hi) each of this lane's rows may see
      // (recomputed here rather than held in registers across the loop).
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          int64_t lo, hi;
          RowKeyRange(geo.type, geo.offset, geo.window, geo.num_k,
                      row0 + warp_row0 + mt * 16 + AccRow(lane, 2 * r), &lo, &hi);
#pragma unroll
          for (int j = 0; j < kBK / 8; ++j) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int64_t key = kb + j * 8 + AccCol(lane, c);
              if (key < lo || key >= hi) s[mt][j][2 * r + c] = -INFINITY;
            }
          }
        }
      }
    }

    // Online softmax: new running max, rescale O and the row sums by α.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float block_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBK / 8; ++j) {
          block_max = fmaxf(block_max, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        }
        block_max = device::QuadMax(block_max);
        const float new_max = fmaxf(row_max[mt][r], block_max);
        const float subtrahend = new_max == -INFINITY ? 0.f : new_max;
        const float alpha = exp2f(row_max[mt][r] - subtrahend);  // 0 when nothing seen yet
        row_max[mt][r] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < kBK / 8; ++j) {
          s[mt][j][2 * r] = exp2f(s[mt][j][2 * r] - subtrahend);
          s[mt][j][2 * r + 1] = exp2f(s[mt][j][2 * r + 1] - subtrahend);
          sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
        }
        row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[mt][j][2 * r] *= alpha;
          o[mt][j][2 * r + 1] *= alpha;
        }
      }
    }

    // O += P·V: two S n8 tiles form one A fragment over 16 keys; each V
    // fragment feeds all kMT m-tiles.
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = E::Pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = E::Pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = E::Pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = E::Pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int j = 0; j < D / 8; j += 2) {
        uint32_t b[4];
        device::LdMatrixX4Trans(b, vt + (kk * 16 + v_lane.row) * kS + j * 8 + v_lane.col);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          E::Mma(o[mt][j], a[mt], b);
          E::Mma(o[mt][j + 1], a[mt], b + 2);
        }
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this buffer
  }

  // Merge (O_b, LSE_b) of this tile into the accumulators (O_a, LSE_a).
  float weight_a[kMT][2], weight_b[kMT][2], merged_lse[kMT][2];
  bool write[kMT][2];
  int64_t row[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    row[mt][0] = row0 + warp_row0 + mt * 16 + AccRow(lane, 0);
    row[mt][1] = row0 + warp_row0 + mt * 16 + AccRow(lane, 2);
  }
  const int64_t lse_stride = item.lse_stride;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = device::QuadSum(row_sum[mt][r]);
      const bool in_item = row[mt][r] < geo.num_q;
      const float lse_b =
          sum > 0.f ? row_max[mt][r] * 0.69314718055994531f + logf(sum) : -INFINITY;
      const float lse_a = in_item ? item.lse_acc[head * lse_stride + row[mt][r]] : -INFINITY;
      write[mt][r] = in_item && lse_b != -INFINITY;
      float wa, wb, lse;
      if (lse_a == -INFINITY) {
        wa = 0.f;
        wb = 1.f;
        lse = lse_b;
      } else if (lse_b == -INFINITY) {
        wa = 1.f;
        wb = 0.f;
        lse = lse_a;
      } else {
        const float m = fmaxf(lse_a, lse_b);
        const float ea = expf(lse_a - m), eb = expf(lse_b - m);
        wa = ea / (ea + eb);
        wb = eb / (ea + eb);
        lse = m + logf(ea + eb);
      }
      weight_a[mt][r] = wa;
      weight_b[mt][r] = sum > 0.f ? wb / sum : 0.f;  // folds the 1/rowsum normalisation
      merged_lse[mt][r] = lse;
    }
  }
  __syncwarp();  // every lane of the quad has read LSE_a before its first lane writes it
  const int64_t o_stride = static_cast<int64_t>(p.num_heads_q) * D;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!write[mt][r]) continue;
      float* o_row = item.o_acc + row[mt][r] * o_stride + head * D;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        float2* dst = reinterpret_cast<float2*>(o_row + j * 8 + AccCol(lane, 0));
        float2 merged = make_float2(weight_b[mt][r] * o[mt][j][2 * r],
                                    weight_b[mt][r] * o[mt][j][2 * r + 1]);
        if (weight_a[mt][r] != 0.f) {  // the first item of a row never reads its zeros
          const float2 old = *dst;
          merged.x += weight_a[mt][r] * old.x;
          merged.y += weight_a[mt][r] * old.y;
        }
        *dst = merged;
      }
      if (AccCol(lane, 0) == 0) item.lse_acc[head * lse_stride + row[mt][r]] = merged_lse[mt][r];
    }
  }
}

}  // namespace hsap::kernels::cuda::kernel

#endif  // HSAP_KERNELS_CUDA_FORWARD_KERNEL_CUH_

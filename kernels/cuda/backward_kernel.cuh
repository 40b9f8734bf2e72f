// Backward attention work items on the GPU (FlashAttention-2 order).
//
// One CTA per (tile = (item, 64-key block), query head) with 4 * D/64 warps.
// K and V of the block are loaded once; the CTA then walks the 64-row Q
// blocks that can see its keys (KBlockRowRange), the next Q/dO block
// loading (cp.async, double buffer, D <= 128) while this one computes. Per Q block, with warp
// w = (key group kw = w % 4, column slice dw = w / 4):
//   A  S^T = K·Q^T, dP^T = V·dO^T      warp: keys 16kw.., rows slice dw
//      P^T = exp2(S^T - LSE), dS^T = P^T∘(dP^T - Δ), mask on edge blocks only
//      P^T and dS^T as hi + lo 16-bit pairs -> shared memory
//   B  dV += P^T·dO, dK += dS^T·Q      warp: keys 16kw.., columns 64dw.. (registers)
//   C  dQ += dS·K                      warp: rows 16kw.., columns 64dw.. -> fp32 atomicAdd
// dS is stored as hi = round16(dS) plus lo = round16(dS - hi), and both
// halves enter the dK and dQ products (two mma's each): dS sums terms that
// cancel (its rows sum to zero), so rounding it to 16 bits alone costs up to
// ~2.7x the output rounding error in a CPU model, past the 2x the tests
// demand; with the split, dQ/dK are as accurate as fp32 dS would make them.
// P is rounded once (as in the forward), which stays under ~1.7x for dV.
// At the end dK (times softmax_scale) and dV are atomically added to the fp32
// accumulators: query heads of one KV head, and items sharing key rows, add
// into the same rows.
//
// Numerics: LSE is the final forward LSE (natural log) and is moved to the
// log2 domain once; a row with LSE = -inf sees no key, so its P is 0 (the
// kernel uses +inf as its subtrahend). Δ = rowsum(dO∘O) comes from
// ComputeDelta, as in flash-attention.
//
// The backward kernel: included by attention_bwd.cu (nvcc) and by the CPU
// emulation test (tests/gpu/kernel_emulation_test.cc).
#ifndef HSAP_KERNELS_CUDA_BACKWARD_KERNEL_CUH_
#define HSAP_KERNELS_CUDA_BACKWARD_KERNEL_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/fragment_layout.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/tiling.h"

namespace hsap::kernels::cuda::kernel {

constexpr int kBwdBlockQ = 64;
constexpr int kBwdBlockK = 64;

template <int D>
struct BwdTraits {
  static constexpr int kSlices = D / 64;  // 64-column slices of dK/dV/dQ per key group
  static constexpr int kWarps = 4 * kSlices;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowsPerWarp = kBwdBlockQ / kSlices;  // step A rows per warp
  static constexpr int kS = D + 8;                          // K, V, Q, dO smem row stride
  static constexpr int kPS = kBwdBlockQ + 8;                // P^T, dS^T smem row stride
  // Q/dO blocks are double-buffered (the next block loads while this one
  // computes) where shared memory allows it: not for D = 256 on sm_80.
  static constexpr int kQBuffers = D <= 128 ? 2 : 1;
  static constexpr int kSmemBytes = (2 * kBwdBlockK + 2 * kBwdBlockQ * kQBuffers) * kS * 2 +
                                    3 * kBwdBlockK * kPS * 2 + 2 * kBwdBlockQ * 4;
};

struct BwdParams {
  const BwdWorkItem* items;  // strides resolved
  const TileRef* tiles;
  int num_heads_q;
  int num_heads_kv;
  int group;  // Hq / Hkv
  float scale;
  float scale_log2;
  // One flag per item (exact_kernels.cuh's scan): tiles of flagged items
  // return at once, the exact kernels compute them. Null: none flagged.
  const uint8_t* exact = nullptr;
};

template <typename T, int D>
__global__ void __launch_bounds__(BwdTraits<D>::kThreads) BackwardKernel(BwdParams p) {
  using Traits = BwdTraits<D>;
  using E = device::ElementTraits<T>;
  constexpr int kS = Traits::kS;
  constexpr int kPS = Traits::kPS;
  constexpr int kRPW = Traits::kRowsPerWarp;
  constexpr int kThreads = Traits::kThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);  // [kBwdBlockK][kS]
  T* v_s = k_s + kBwdBlockK * kS;           // [kBwdBlockK][kS]
  T* q_base = v_s + kBwdBlockK * kS;        // per buffer: Q, dO [kBwdBlockQ][kS] each
  T* pt_s = q_base + Traits::kQBuffers * 2 * kBwdBlockQ * kS;  // [kBwdBlockK][kPS]  P^T
  T* dst_s = pt_s + kBwdBlockK * kPS;       // [kBwdBlockK][kPS]  dS^T, rounded (hi)
  T* dsl_s = dst_s + kBwdBlockK * kPS;      // [kBwdBlockK][kPS]  dS^T - hi (lo)
  float* lse_s = reinterpret_cast<float*>(dsl_s + kBwdBlockK * kPS);  // [kBwdBlockQ], log2 domain
  float* delta_s = lse_s + kBwdBlockQ;                                 // [kBwdBlockQ]

  const TileRef tile = p.tiles[blockIdx.x];
  if (p.exact != nullptr && p.exact[tile.item]) return;  // the exact kernels' item
  const BwdWorkItem& item = p.items[tile.item];
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const SliceGeometry geo{item.num_q, item.num_k, item.type, item.offset, item.window};
  const int64_t key0 = static_cast<int64_t>(tile.block) * kBwdBlockK;
  const int64_t key_end = key0 + kBwdBlockK < geo.num_k ? key0 + kBwdBlockK : geo.num_k;
  int64_t row_begin, row_end;
  KBlockRowRange(geo, key0, key_end, &row_begin, &row_end);
  if (row_begin >= row_end) return;  // BuildBackwardTiles leaves these out

  const int64_t q_stride = item.q_row_stride;
  const int64_t kv_stride = item.kv_row_stride;
  const T* k = static_cast<const T*>(item.k) + key0 * kv_stride + kv_head * D;
  const T* v = static_cast<const T*>(item.v) + key0 * kv_stride + kv_head * D;
  device::LoadTileAsync<T, kBwdBlockK, D, kS, kThreads>(k_s, k, kv_stride, geo.num_k - key0);
  device::LoadTileAsync<T, kBwdBlockK, D, kS, kThreads>(v_s, v, kv_stride, geo.num_k - key0);

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // ldmatrix row addresses (fragment_layout.h).
  const LaneRowCol a_lane = LdmRowMajorA(lane), b_lane = LdmBPair(lane),
                   bt_lane = LdmTransBPair(lane), at_lane = LdmTransA(lane);
  const int kw = warp % 4;  // key group (steps A, B) / row group (step C)
  const int dw = warp / 4;  // row slice (step A) / column slice (steps B, C)

  float dk[8][4], dv[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.f;
  }

  // Queues the Q and dO rows of the block starting at `rb` into buffer `buf`.
  auto load_q = [&](int64_t rb, int buf) {
    T* q_dst = q_base + buf * 2 * kBwdBlockQ * kS;
    const T* q = static_cast<const T*>(item.q) + rb * q_stride + head * D;
    const T* dout = static_cast<const T*>(item.dout) + rb * q_stride + head * D;
    device::LoadTileAsync<T, kBwdBlockQ, D, kS, kThreads>(q_dst, q, q_stride, geo.num_q - rb);
    device::LoadTileAsync<T, kBwdBlockQ, D, kS, kThreads>(q_dst + kBwdBlockQ * kS, dout, q_stride,
                                                          geo.num_q - rb);
  };
  const int num_q_blocks = static_cast<int>(CeilBlocks(row_end - row_begin, kBwdBlockQ));
  load_q(row_begin, 0);  // committed together with K and V
  device::CpAsyncCommit();

  for (int qb = 0; qb < num_q_blocks; ++qb) {
    const int64_t rb = row_begin + static_cast<int64_t>(qb) * kBwdBlockQ;
    const int buf = Traits::kQBuffers == 2 ? (qb & 1) : 0;
    const bool prefetch = Traits::kQBuffers == 2 && qb + 1 < num_q_blocks;
    if (prefetch) {  // the other buffer was last read before the previous trailing barrier
      load_q(rb + kBwdBlockQ, buf ^ 1);
      device::CpAsyncCommit();
    }
    const T* q_s = q_base + buf * 2 * kBwdBlockQ * kS;  // [kBwdBlockQ][kS]
    const T* do_s = q_s + kBwdBlockQ * kS;               // [kBwdBlockQ][kS]
    for (int r = threadIdx.x; r < kBwdBlockQ; r += kThreads) {
      const int64_t row = rb + r;
      float lse = INFINITY, delta = 0.f;
      if (row < geo.num_q) {
        const float l = item.lse[head * item.lse_stride + row];
        lse = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
        delta = item.delta[head * item.lse_stride + row];
      }
      lse_s[r] = lse;
      delta_s[r] = delta;
    }
    if (prefetch) {
      device::CpAsyncWait<1>();  // this block's group, not the prefetch
    } else {
      device::CpAsyncWait<0>();
    }
    __syncthreads();
    const bool interior = BlockIsInterior(geo, rb, rb + kBwdBlockQ, key0, key0 + kBwdBlockK);

    // Step A: S^T and dP^T for keys 16kw.. and rows [dw * kRPW, +kRPW).
    {
      float st[kRPW / 8][4], dpt[kRPW / 8][4];
#pragma unroll
      for (int j = 0; j < kRPW / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a_k[4], a_v[4];
        const int a_off = (kw * 16 + a_lane.row) * kS + kk * 16 + a_lane.col;
        device::LdMatrixX4(a_k, k_s + a_off);
        device::LdMatrixX4(a_v, v_s + a_off);
#pragma unroll
        for (int j = 0; j < kRPW / 8; j += 2) {
          const int b_off = (dw * kRPW + j * 8 + b_lane.row) * kS + kk * 16 + b_lane.col;
          uint32_t b[4];
          device::LdMatrixX4(b, q_s + b_off);
          E::Mma(st[j], a_k, b);
          E::Mma(st[j + 1], a_k, b + 2);
          device::LdMatrixX4(b, do_s + b_off);
          E::Mma(dpt[j], a_v, b);
          E::Mma(dpt[j + 1], a_v, b + 2);
        }
      }
#pragma unroll
      for (int j = 0; j < kRPW / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int local_row = dw * kRPW + j * 8 + AccCol(lane, e);
          const int local_key = kw * 16 + AccRow(lane, e);
          float prob = exp2f(st[j][e] * p.scale_log2 - lse_s[local_row]);
          if (!interior) {
            const int64_t r = rb + local_row, c = key0 + local_key;
            if (r >= geo.num_q || c >= geo.num_k ||
                !SliceAllows(geo.type, geo.offset, geo.window, r, c)) {
              prob = 0.f;
            }
          }
          st[j][e] = prob;
          dpt[j][e] = prob * (dpt[j][e] - delta_s[local_row]);
        }
        // Registers (0, 1) and (2, 3) are column pairs of rows AccRow(lane, 0 / 2).
        const int col = dw * kRPW + j * 8 + AccCol(lane, 0);
        const int key_lo = kw * 16 + AccRow(lane, 0), key_hi = kw * 16 + AccRow(lane, 2);
        uint32_t* pt_lo = reinterpret_cast<uint32_t*>(pt_s + key_lo * kPS + col);
        uint32_t* pt_hi = reinterpret_cast<uint32_t*>(pt_s + key_hi * kPS + col);
        *pt_lo = E::Pack(st[j][0], st[j][1]);
        *pt_hi = E::Pack(st[j][2], st[j][3]);
        const float* ds = dpt[j];
        *reinterpret_cast<uint32_t*>(dst_s + key_lo * kPS + col) = E::Pack(ds[0], ds[1]);
        *reinterpret_cast<uint32_t*>(dst_s + key_hi * kPS + col) = E::Pack(ds[2], ds[3]);
        *reinterpret_cast<uint32_t*>(dsl_s + key_lo * kPS + col) =
            E::Pack(ds[0] - E::Round(ds[0]), ds[1] - E::Round(ds[1]));
        *reinterpret_cast<uint32_t*>(dsl_s + key_hi * kPS + col) =
            E::Pack(ds[2] - E::Round(ds[2]), ds[3] - E::Round(ds[3]));
      }
    }
    __syncthreads();

    // Step B: dV += P^T·dO, dK += dS^T·Q over the block's 64 rows.
#pragma unroll
    for (int kk = 0; kk < kBwdBlockQ / 16; ++kk) {
      uint32_t a_p[4], a_ds[4], a_dsl[4];
      const int a_off = (kw * 16 + a_lane.row) * kPS + kk * 16 + a_lane.col;
      device::LdMatrixX4(a_p, pt_s + a_off);
      device::LdMatrixX4(a_ds, dst_s + a_off);
      device::LdMatrixX4(a_dsl, dsl_s + a_off);
#pragma unroll
      for (int j = 0; j < 8; j += 2) {
        const int b_off = (kk * 16 + bt_lane.row) * kS + dw * 64 + j * 8 + bt_lane.col;
        uint32_t b[4];
        device::LdMatrixX4Trans(b, do_s + b_off);
        E::Mma(dv[j], a_p, b);
        E::Mma(dv[j + 1], a_p, b + 2);
        device::LdMatrixX4Trans(b, q_s + b_off);
        E::Mma(dk[j], a_ds, b);
        E::Mma(dk[j + 1], a_ds, b + 2);
        E::Mma(dk[j], a_dsl, b);
        E::Mma(dk[j + 1], a_dsl, b + 2);
      }
    }

    // Step C: dQ rows 16kw.., columns 64dw.. += dS·K (dS read transposed).
    {
      float dq[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBwdBlockK / 16; ++kk) {
        uint32_t a[4], a_lo[4];
        const int a_off = (kk * 16 + at_lane.row) * kPS + kw * 16 + at_lane.col;
        device::LdMatrixX4Trans(a, dst_s + a_off);
        device::LdMatrixX4Trans(a_lo, dsl_s + a_off);
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          uint32_t b[4];
          device::LdMatrixX4Trans(b, k_s + (kk * 16 + bt_lane.row) * kS + dw * 64 + j * 8 + bt_lane.col);
          E::Mma(dq[j], a, b);
          E::Mma(dq[j + 1], a, b + 2);
          E::Mma(dq[j], a_lo, b);
          E::Mma(dq[j + 1], a_lo, b + 2);
        }
      }
      const int64_t dq_stride = static_cast<int64_t>(p.num_heads_q) * D;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = rb + kw * 16 + AccRow(lane, 2 * half);
        if (row >= geo.num_q) continue;
        float* dst = item.dq_acc + row * dq_stride + head * D + dw * 64 + AccCol(lane, 0);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          atomicAdd(dst + j * 8, dq[j][2 * half] * p.scale);
          atomicAdd(dst + j * 8 + 1, dq[j][2 * half + 1] * p.scale);
        }
      }
    }
    __syncthreads();  // the next Q block overwrites a Q/dO buffer, pt_s, dst_s, dsl_s
    if (Traits::kQBuffers == 1 && qb + 1 < num_q_blocks) {
      load_q(rb + kBwdBlockQ, 0);
      device::CpAsyncCommit();
    }
  }

  const int64_t kv_acc_stride = static_cast<int64_t>(p.num_heads_kv) * D;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t key = key0 + kw * 16 + AccRow(lane, 2 * half);
    if (key >= geo.num_k) continue;
    const int64_t at = key * kv_acc_stride + kv_head * D + dw * 64 + AccCol(lane, 0);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      atomicAdd(item.dk_acc + at + j * 8, dk[j][2 * half] * p.scale);
      atomicAdd(item.dk_acc + at + j * 8 + 1, dk[j][2 * half + 1] * p.scale);
      atomicAdd(item.dv_acc + at + j * 8, dv[j][2 * half]);
      atomicAdd(item.dv_acc + at + j * 8 + 1, dv[j][2 * half + 1]);
    }
  }
}

}  // namespace hsap::kernels::cuda::kernel

#endif  // HSAP_KERNELS_CUDA_BACKWARD_KERNEL_CUH_

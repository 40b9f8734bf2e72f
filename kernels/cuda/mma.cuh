// Device building blocks of the attention kernels (nvcc only): tensor-core
// mma.sync m16n8k16 with fp32 accumulators, ldmatrix fragment loads from
// shared memory, cp.async global->shared copies, and the bf16/fp16 traits.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", g = lane / 4, t = lane % 4):
//   A (16x16, row-major)  a0: (g, 2t..2t+1)   a1: (g+8, 2t..)  a2: (g, 2t+8..)  a3: (g+8, 2t+8..)
//   B (16x8,  k x n)      b0: (k=2t..2t+1, n=g)                b1: (k=2t+8.., n=g)
//   C (16x8,  fp32)       c0,c1: (g, 2t..2t+1)                 c2,c3: (g+8, 2t..2t+1)
// ldmatrix.x4 gives register i the 8x8 matrix whose row addresses lanes
// 8i..8i+7 supplied, thread l holding (row l/4, cols 2(l%4)..+1); with .trans
// it holds (rows 2(l%4)..+1, col l/4) instead. A C fragment pair (two n8
// tiles) is therefore an A fragment once packed to 16 bits, which is how P
// feeds the P·V product without going through shared memory.
#ifndef HSAP_KERNELS_CUDA_MMA_CUH_
#define HSAP_KERNELS_CUDA_MMA_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#if defined(HSAP_CUDA_EMULATION)
#include "kernels/cuda/emulation.h"  // CPU stand-ins for the intrinsics below
#endif

namespace hsap::kernels::cuda::device {

template <typename T>
struct ElementTraits;

template <>
struct ElementTraits<__nv_bfloat16> {
  // Packs (lo, hi) into one register, round to nearest even.
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return bits;
  }
  static __device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 FromFloat(float x) {
    return __float2bfloat16_rn(x);
  }
  // x rounded to bf16 and back.
  static __device__ __forceinline__ float Round(float x) { return ToFloat(FromFloat(x)); }
  // c += a * b
  static __device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(HSAP_CUDA_EMULATION)
    emu::Mma(c, a, b, /*is_bf16=*/true);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

template <>
struct ElementTraits<__half> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    return bits;
  }
  static __device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half FromFloat(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float Round(float x) { return ToFloat(FromFloat(x)); }
  static __device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(HSAP_CUDA_EMULATION)
    emu::Mma(c, a, b, /*is_bf16=*/false);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
  }
};

#if !defined(HSAP_CUDA_EMULATION)
__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; this lane supplies the row address `p`.
__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p)));
}

// 16 bytes global -> shared, bypassing L1; zero-fills when !valid (then no
// byte of `src` is read, but it must still be a valid address).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(dst)),
               "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
#else   // HSAP_CUDA_EMULATION: the same contracts on the CPU (emulation.h)
inline void LdMatrixX4(uint32_t r[4], const void* p) { emu::LdMatrixX4<false>(r, p); }
inline void LdMatrixX4Trans(uint32_t r[4], const void* p) { emu::LdMatrixX4<true>(r, p); }
inline void CpAsync16(void* dst, const void* src, bool valid) { emu::CpAsync16(dst, src, valid); }
inline void CpAsyncCommit() { emu::CpAsyncCommit(); }
template <int kPending>
void CpAsyncWait() {
  emu::CpAsyncWait(kPending);
}
#endif

// Copies rows [0, kRows) of a tile, kCols elements each, from global memory
// (row r at src + r * src_stride elements) to shared memory (row stride
// kSmemStride elements). Rows at or past `valid_rows` are zero-filled.
// Called by all kThreads threads of the block; only queues cp.async copies.
template <typename T, int kRows, int kCols, int kSmemStride, int kThreads>
__device__ __forceinline__ void LoadTileAsync(T* smem, const T* src, int64_t src_stride,
                                              int64_t valid_rows) {
  constexpr int kChunksPerRow = kCols * sizeof(T) / 16;
  constexpr int kChunks = kRows * kChunksPerRow;
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * (16 / sizeof(T));
    const bool valid = row < valid_rows;
    const T* from = valid ? src + row * src_stride + col : src;
    CpAsync16(smem + row * kSmemStride + col, from, valid);
  }
}

// max / sum over the four lanes of a quad (the lanes holding one C row).
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace hsap::kernels::cuda::device

#endif  // HSAP_KERNELS_CUDA_MMA_CUH_

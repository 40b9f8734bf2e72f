// Internal to kernels/cpu: the SIMD tiles behind attention.h, the packing
// passes that feed them, and the small pieces of bookkeeping they share with
// the task scheduler (attention.cc).
//
// Operands are *packed* before the tiles run: a work item's K and V rows of
// one KV head (forward), its Q and dO rows of one query head (backward) are
// copied once per call, converted to fp32 and, for Q, pre-scaled, into
// contiguous rows (PackRows) that every tile reading them shares. The
// tensors' own layout holds all heads of a token in one row, so a head's
// rows are 64-512 bytes every few KiB: read in place, every tile would pay
// that stride (measured on Zen 4: -30% at D = 32, -15% at D = 128 for a
// forward tile) and convert bf16 again.
//
// A *forward tile* is one (work item, query head, block of kBlockQ query
// rows, chunk of keys): it streams the packed key range those rows can see
// in blocks of kBlockK keys with an online softmax (FlashAttention-2) and
// returns the normalised partial O and its LSE. A *backward tile* is one
// (work item, KV head, block of kBwdBlockK keys, run of query rows that see
// them): for each query head of the KV head it visits the rows' query
// blocks and returns the key block's dK/dV (summed over the heads) and each
// head's dQ, all into private buffers; the scheduler (attention.cc) adds
// them to the accumulators in a fixed order. Both are compiled once per
// SIMD target (Highway) and chosen at run time (tile_kernels.cc); the exact
// tiles (exact_tiles.cc) compute the same outputs in float64 with IEEE
// semantics for inputs that are not all finite, from the unpacked tensors.
// Nothing here is part of the public API.
#ifndef HSAP_KERNELS_CPU_TILE_KERNELS_H_
#define HSAP_KERNELS_CPU_TILE_KERNELS_H_

#include <cstdint>

#include "common/dtype.h"
#include "common/mask.h"

namespace hsap::kernels::cpu::internal {

// Query rows per forward tile and keys per inner forward step; query rows
// per inner backward step and keys per backward tile. All are multiples of
// two vectors of every SIMD target (AVX2: 8 floats, AVX-512: 16 floats), so
// padded columns never need a scalar tail.
inline constexpr int kBlockQ = 64;
inline constexpr int kBlockK = 64;
inline constexpr int kBwdBlockQ = 64;
inline constexpr int kBwdBlockK = 128;

// Merges one row of a partial result (o_b: [dim], lse_b) into (o_a, *lse_a);
// see MergePartial in attention.h for the −inf rules.
void MergeRow(int dim, float* o_a, float* lse_a, const float* o_b, float lse_b);

// dst[r * dst_row_stride + c] += src[r * src_row_stride + c] for r < rows,
// c < cols.
void AddRows(float* dst, int64_t dst_row_stride, const float* src, int64_t src_row_stride,
             int64_t rows, int cols);

// The keys a run of query rows [row_begin, row_end) of a slice-shaped item
// sees: the union of RowKeyRange over its rows, as [*key_begin, *key_end).
// Empty (begin >= end) when no row sees a key.
void KeysSeenByRows(MaskType type, int64_t offset, int64_t window, int64_t num_k,
                    int64_t row_begin, int64_t row_end, int64_t* key_begin, int64_t* key_end);

// The query rows of [0, num_q) that see at least one key of
// [key_begin, key_end), as [*row_begin, *row_end). Rows seeing a given key
// range are contiguous because RowKeyRange's bounds never decrease with the
// row.
void RowsSeeingKeys(MaskType type, int64_t offset, int64_t window, int64_t num_q,
                    int64_t num_k, int64_t key_begin, int64_t key_end, int64_t* row_begin,
                    int64_t* row_end);

// The row length of packed backward operands and outputs for `head_dim` on
// the SIMD target the dispatcher picks: head_dim rounded up to two vectors.
// The forward packs K/V with row length head_dim.
int PackedRowLength(int head_dim);

// dst[r * dst_row_length + c] = scale * float(src[(r * src_row_stride + c]) for
// r < rows, c < cols, and 0 for cols <= c < dst_row_length.
void PackRows(const void* src, DType dtype, int64_t src_row_stride, int64_t rows, int cols,
              float scale, float* dst, int64_t dst_row_length);

// Whether rows [0, rows) x [0, cols) of a tensor with `row_stride`
// (elements) hold a NaN, an infinity, or (fp32, bf16) a value of magnitude
// 2^max_exp or more (whose products could overflow the fast tiles' fp32
// arithmetic; fp16 cannot hold such values).
bool HasNonFiniteOrHuge(const void* base, DType dtype, int64_t rows, int64_t row_stride,
                        int64_t cols, int max_exp);

// Everything one forward tile reads and writes.
struct FwdTile {
  const void* q = nullptr;  // row `first_row` of the item, at this head: [num_rows] x D, dtype
  // Row 0 of the item's keys, at the kv head: [num_k] x D. The SIMD tile
  // reads packed fp32 rows (kv_row_stride = D); the exact tile `dtype` rows
  // in place.
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_row_stride = 0;   // elements
  int64_t kv_row_stride = 0;  // elements
  int num_rows = 0;           // <= kBlockQ
  int64_t first_row = 0;      // of this tile within the item (mask coordinates)
  int64_t num_k = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;
  int64_t window = -1;
  int head_dim = 0;
  DType dtype = DType::kFloat32;
  float softmax_scale = 0.f;
  float* o = nullptr;    // [num_rows, head_dim] out: normalised partial O
  float* lse = nullptr;  // [num_rows] out: natural-log LSE, −inf where no key
};

// Returns false (and writes nothing) when no row of the tile sees a key.
// REQUIRES: k, v packed fp32.
bool ForwardTile(const FwdTile& tile);

// Everything one SIMD backward tile reads and writes. Row length of every
// packed operand and output: Dp = PackedRowLength(head_dim).
struct BwdTile {
  int heads = 1;  // query heads of the KV head, visited in order
  // Packed rows [row_begin, row_end) of each head, head h at h * head_stride:
  const float* q = nullptr;     // [heads][rows][Dp] softmax_scale * log2(e) * Q
  const float* dout = nullptr;  // [heads][rows][Dp] dO
  int64_t head_stride = 0;      // floats
  const float* lse = nullptr;    // head h, item row r at lse[h * lse_head_stride + r]
  const float* delta = nullptr;  // likewise
  int64_t lse_head_stride = 0;
  const void* k = nullptr;  // row 0 of the item, at the kv head: [num_k] x D, dtype
  const void* v = nullptr;
  int64_t kv_row_stride = 0;
  int64_t num_q = 0;
  int64_t num_k = 0;
  int64_t first_key = 0;  // of this tile's key block within the item
  int num_keys = 0;       // <= kBwdBlockK
  // The query rows of the item this tile visits: a run of rows that each see
  // at least one key of the block (RowsSeeingKeys, possibly cut in chunks).
  int64_t row_begin = 0;
  int64_t row_end = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;
  int64_t window = -1;
  int head_dim = 0;
  DType dtype = DType::kFloat32;
  float softmax_scale = 0.f;
  float* dq = nullptr;  // [heads][row_end - row_begin][Dp] out (overwritten)
  float* dk = nullptr;  // [num_keys][Dp] out, summed over the heads (overwritten)
  float* dv = nullptr;  // [num_keys][Dp] out (overwritten)
};

// Returns false (and writes nothing) when no query row sees the key block.
bool BackwardTile(const BwdTile& tile);

// One query head's backward tile in float64 from the unpacked tensors, for
// tiles whose inputs are not all finite (exact_tiles.cc).
struct ExactBwdTile {
  const void* q = nullptr;     // row 0 of the item, at this head: [num_q] x D
  const void* dout = nullptr;  // row 0 of the item, at this head: [num_q] x D
  const float* lse = nullptr;    // [num_q] of this head, stride 1
  const float* delta = nullptr;  // [num_q] of this head, stride 1
  int64_t q_row_stride = 0;      // elements, q and dout
  const void* k = nullptr;       // row 0 of the item, at the kv head: [num_k] x D
  const void* v = nullptr;
  int64_t kv_row_stride = 0;
  int64_t num_q = 0;
  int64_t num_k = 0;
  int64_t first_key = 0;
  int num_keys = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  MaskType type = MaskType::kFull;
  int64_t offset = 0;
  int64_t window = -1;
  int head_dim = 0;
  DType dtype = DType::kFloat32;
  float softmax_scale = 0.f;
  int64_t out_row_stride = 0;  // of dq, dk, dv (>= head_dim; columns past it are zeroed)
  float* dq = nullptr;  // [row_end - row_begin][out_row_stride] out (overwritten)
  float* dk = nullptr;  // [num_keys][out_row_stride] out (overwritten)
  float* dv = nullptr;  // [num_keys][out_row_stride] out (overwritten)
};

// The forward tile in float64, one (query, key) pair at a time, with the NaN
// and infinity semantics of a dense softmax over the allowed pairs
// (attention.h); k and v unpacked (`dtype`). Same contract as ForwardTile.
bool ExactForwardTile(const FwdTile& tile);
// Returns false (and writes nothing) when the rows are empty.
bool ExactBackwardTile(const ExactBwdTile& tile);

// dst[i] = float(src[first + i]) for i < n.
void ConvertToFloat(const void* src, DType dtype, int64_t first, int64_t n, float* dst);

// y[i] = the tiles' exp2(x[i]) (clamped to [-127, 127] or, on AVX-512,
// [-160, 127] first) for i < n. REQUIRES: n a multiple of 16.
void Exp2ForTest(const float* x, int64_t n, float* y);

// Name of the SIMD target the dispatcher picked on this machine ("AVX2",
// "AVX3", "EMU128", ...), for logs and the benchmark.
const char* SimdTargetName();

}  // namespace hsap::kernels::cpu::internal

#endif  // HSAP_KERNELS_CPU_TILE_KERNELS_H_

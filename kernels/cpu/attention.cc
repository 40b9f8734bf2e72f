// Work-item scheduling for the CPU attention kernels (attention.h).
//
// Forward: one task per (item, query head, block of kBlockQ rows, half as
// many at D >= 256, chunk of keys); the key chunks are the
// kFwdKeyChunk-aligned pieces of the item's keys, so the tasks of every
// query block and every query head of a KV head read the same *segment*:
// one (KV head, item, key chunk) whose K and V rows are packed once (fp32,
// contiguous; tile_kernels.h) before its tasks run.
// Backward: one task per (item, KV head, block of kBwdBlockK keys, run of the
// query rows that see them inside one kBwdChunkRows-aligned chunk); the
// segment is (KV head, item, row chunk), whose Q (pre-scaled) and dO rows of
// every query head of the KV head are packed once. A task computes its tile
// into private buffers.
//
// Segments are visited in a fixed order (KV head, item, chunk) and packed a
// batch at a time (consecutive segments up to kPackKeys keys or kPackRows
// rows: bounded scratch); a batch's tasks then run largest first.
//
// Determinism: tasks are put in one canonical order and run in waves of a
// fixed number of tasks (task_waves.h): the tiles of a wave are computed in parallel, then
// merged into the accumulators one task after another in that order. Every
// accumulator element therefore receives its contributions in the same
// order whatever the number of threads, and the result is bitwise the same
// on every run.
//
// Non-finite inputs: an item whose Q, K, V (backward also dO, Delta, LSE)
// are not all finite runs on the exact tiles (exact_tiles.cc), which touch
// allowed pairs only, in float64, from the unpacked tensors.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cpu/scratch.h"
#include "kernels/cpu/task_waves.h"
#include "kernels/cpu/tile_kernels.h"

namespace hsap::kernels::cpu {
namespace {

using internal::kBwdBlockK;
using internal::kBlockQ;
using internal::Batch;
using internal::MakeBatches;
using internal::PackBatch;
using internal::RunParallel;
using internal::Scratch;
using internal::ScratchPtr;
using internal::Segment;
using internal::Task;
using internal::WaveRunner;

// Waves hold at most this many tasks (and internal::WavePairs(D) pairs):
// they depend on the shape only, never on the pool; merges run in task
// order whatever the waves (task_waves.h).
constexpr int64_t kForwardWave = 64;
constexpr int64_t kBackwardWave = 32;
// Keys a forward task streams at most: an item's keys are cut into chunks
// aligned to multiples of this, whose partial results merge in order.
constexpr int64_t kFwdKeyChunk = 4096;
// Query rows a backward task visits at most (bounds its private dQ buffer):
// an item's rows are cut into chunks aligned to multiples of this.
constexpr int64_t kBwdChunkRows = 512;
// A batch of segments packs at most this many keys (forward, K and V rows)
// or query rows times heads (backward, Q and dO rows) beyond its first
// segment: the packed scratch stays a few MiB whatever the call.
constexpr int64_t kPackKeys = 8192;
constexpr int64_t kPackRows = 4096;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// p[0, n) = value over the pool: an accumulator's fresh pages are first
// touched (faulted in and zeroed) by every thread, not the caller alone.
void FillParallel(float* p, int64_t n, float value, ThreadPool* pool) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  RunParallel(pool, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    std::fill(p + c * kChunk, p + std::min(n, (c + 1) * kChunk), value);
  });
}

const char* At(const void* base, int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * DTypeSize(dtype);
}

// Magnitude bounds of the fast tiles: forward |q|, |k|, |v| < 2^56 keeps
// every logit (at most D * 2^112 <= 2^120) and accumulation finite in fp32;
// backward, where three such factors meet (dS * q, rows summed), 2^30.
constexpr int kForwardMaxExp = 56;
constexpr int kBackwardMaxExp = 30;

// LSE or Delta columns [0, n) of `heads` heads holding a NaN, a +inf, or
// (when `any_infinity`) a -inf.
bool HasBadFloats(const float* base, int heads, int64_t stride, int64_t n, bool any_infinity) {
  for (int h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const float x = base[h * stride + i];
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity() ||
          (any_infinity && std::isinf(x))) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

namespace internal {

void MergeRow(int dim, float* o_a, float* lse_a, const float* o_b, float lse_b) {
  const float la = *lse_a;
  if (lse_b == kNegInf) {
    // Nothing to add. A row that has seen nothing is O = 0 by definition.
    if (la == kNegInf) std::fill(o_a, o_a + dim, 0.f);
    return;
  }
  if (la == kNegInf) {
    std::copy(o_b, o_b + dim, o_a);
    *lse_a = lse_b;
    return;
  }
  // Weights in double: the merged LSE then carries one fp32 rounding, not the
  // error of a float exp/log chain (LSE near 0 would show it as relative error).
  const double mx = std::max(la, lse_b);
  const double wa = std::exp(la - mx), wb = std::exp(lse_b - mx);
  const double sum = wa + wb;
  const float ca = static_cast<float>(wa / sum), cb = static_cast<float>(wb / sum);
  for (int c = 0; c < dim; ++c) o_a[c] = ca * o_a[c] + cb * o_b[c];
  *lse_a = static_cast<float>(mx + std::log(sum));
}

void KeysSeenByRows(MaskType type, int64_t offset, int64_t window, int64_t num_k,
                    int64_t row_begin, int64_t row_end, int64_t* key_begin, int64_t* key_end) {
  *key_begin = 0;
  *key_end = 0;
  if (row_begin >= row_end || num_k <= 0) return;
  if (type == MaskType::kFull) {
    *key_end = num_k;
    return;
  }
  // Rows with a non-empty range are contiguous; find the first and last.
  auto nonempty = [&](int64_t r) {
    int64_t lo, hi;
    RowKeyRange(type, offset, window, num_k, r, &lo, &hi);
    return lo < hi;
  };
  // Non-empty iff r + offset >= 0 and r + offset - window < num_k.
  int64_t first = std::max(row_begin, -offset);
  int64_t last = row_end - 1;
  if (window >= 0) last = std::min(last, num_k - 1 + window - offset);
  if (first > last) return;
  if (!nonempty(first) || !nonempty(last)) {  // not reachable if the algebra above holds
    first = row_begin;
    while (first < row_end && !nonempty(first)) ++first;
    last = row_end - 1;
    while (last >= first && !nonempty(last)) --last;
    if (first > last) return;
  }
  int64_t lo, hi;
  RowKeyRange(type, offset, window, num_k, first, &lo, &hi);
  *key_begin = lo;
  RowKeyRange(type, offset, window, num_k, last, &lo, &hi);
  *key_end = hi;
}

void RowsSeeingKeys(MaskType type, int64_t offset, int64_t window, int64_t num_q,
                    int64_t num_k, int64_t key_begin, int64_t key_end, int64_t* row_begin,
                    int64_t* row_end) {
  *row_begin = *row_end = 0;
  if (key_begin >= key_end || num_q <= 0) return;
  if (type == MaskType::kFull) {
    *row_end = num_q;
    return;
  }
  // First row r with pred(r) true, for a predicate monotone in r.
  auto first_true = [&](auto pred) {
    int64_t lo = 0, hi = num_q;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (pred(mid)) hi = mid; else lo = mid + 1;
    }
    return lo;
  };
  *row_begin = first_true([&](int64_t r) {
    int64_t lo, hi;
    RowKeyRange(type, offset, window, num_k, r, &lo, &hi);
    return hi > key_begin;  // rows past the window's end have lo = num_k: cut by row_end
  });
  *row_end = first_true([&](int64_t r) {
    int64_t lo, hi;
    RowKeyRange(type, offset, window, num_k, r, &lo, &hi);
    return lo >= key_end;
  });
  if (*row_end < *row_begin) *row_end = *row_begin;
}

}  // namespace internal

bool Forward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items, ThreadPool* pool,
             const StopFn* stop) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int group = Hq / Hkv;
  const int64_t o_row_stride = static_cast<int64_t>(Hq) * D;
  auto q_stride_of = [&](const FwdWorkItem& it) {
    return it.q_row_stride > 0 ? it.q_row_stride : o_row_stride;
  };
  auto kv_stride_of = [&](const FwdWorkItem& it) {
    return it.kv_row_stride > 0 ? it.kv_row_stride : int64_t{Hkv} * D;
  };
  // Items whose inputs are not all finite, or large enough to overflow fp32
  // products, run on the exact (float64) tiles.
  std::vector<char> exact(items.size(), 0);
  RunParallel(pool, static_cast<int64_t>(items.size()), [&](int64_t n) {
    const FwdWorkItem& it = items[n];
    const int e = kForwardMaxExp;
    exact[n] =
        internal::HasNonFiniteOrHuge(it.q, shape.dtype, it.num_q, q_stride_of(it), int64_t{Hq} * D, e) ||
        internal::HasNonFiniteOrHuge(it.k, shape.dtype, it.num_k, kv_stride_of(it), int64_t{Hkv} * D, e) ||
        internal::HasNonFiniteOrHuge(it.v, shape.dtype, it.num_k, kv_stride_of(it), int64_t{Hkv} * D, e);
  });

  // Segments (KV head, item, aligned key chunk), in that order.
  std::vector<int64_t> first_chunk(items.size() + 1, 0);
  for (size_t n = 0; n < items.size(); ++n) {
    first_chunk[n + 1] = first_chunk[n] + (items[n].num_k + kFwdKeyChunk - 1) / kFwdKeyChunk;
  }
  const int64_t chunks = first_chunk.back();
  std::vector<Segment> segments(static_cast<size_t>(chunks * Hkv));
  std::vector<Task> tasks;
  // At D >= 256 a tile of kBlockQ rows has a 64 KiB Q^T and O^T each, more
  // than the L1 holds; half as many rows measured up to 16 % faster on the
  // MHA shapes (docs/results/kernel_bench.md).
  const int64_t block_rows = D >= 256 ? kBlockQ / 2 : kBlockQ;
  for (size_t n = 0; n < items.size(); ++n) {
    const FwdWorkItem& it = items[n];
    for (int64_t r0 = 0; r0 < it.num_q; r0 += block_rows) {
      const int64_t r1 = std::min(it.num_q, r0 + block_rows);
      int64_t k0, k1;
      internal::KeysSeenByRows(it.type, it.offset, it.window, it.num_k, r0, r1, &k0, &k1);
      if (k0 >= k1) continue;  // these rows see nothing: accumulators stay as they are
      for (int64_t ci = k0 / kFwdKeyChunk; ci * kFwdKeyChunk < k1; ++ci) {
        const int64_t c0 = std::max(k0, ci * kFwdKeyChunk);
        const int64_t c1 = std::min(k1, (ci + 1) * kFwdKeyChunk);
        for (int h = 0; h < Hq; ++h) {
          Task t{static_cast<int32_t>(n), h, r0, (r1 - r0) * (c1 - c0)};
          t.key_begin = c0;
          t.key_end = c1;
          t.segment = (h / group) * chunks + first_chunk[n] + ci;
          Segment& seg = segments[t.segment];
          seg.item = static_cast<int32_t>(n);
          seg.kv_head = h / group;
          seg.used = true;
          if (!exact[n]) {  // exact items read K/V in place
            seg.begin = std::min(seg.begin, c0);
            seg.end = std::max(seg.end, c1);
          }
          tasks.push_back(t);
        }
      }
    }
  }
  int64_t packed_floats = 0;
  const std::vector<Batch> batches = MakeBatches(
      &tasks, &segments, kPackKeys, 2 * int64_t{D},
      [](const Segment& g) { return std::max<int64_t>(0, g.end - g.begin); }, &packed_floats);
  const auto packed = Scratch(static_cast<size_t>(packed_floats));

  const int64_t wave = std::min<int64_t>(kForwardWave, std::max<size_t>(tasks.size(), 1));
  // Two sets of slots: one wave computes while the previous one merges.
  const auto o = Scratch(static_cast<size_t>(2 * wave) * kBlockQ * D);
  const auto lse = Scratch(static_cast<size_t>(2 * wave) * kBlockQ);
  std::vector<char> saw(2 * wave, 0);
  std::vector<int> rows(2 * wave, 0);
  auto compute = [&](int64_t index, int64_t slot) {
    const Task& task = tasks[index];
    const FwdWorkItem& it = items[task.item];
    const Segment& seg = segments[task.segment];
    const int h = task.head, kv_head = h / group;
    const int64_t kv_stride = kv_stride_of(it);
    internal::FwdTile tile;
    // The key chunk [key_begin, key_end) as an item of its own: rows and
    // pointers shifted, the causal diagonal moved with them.
    tile.q = At(it.q, task.block_begin * q_stride_of(it) + int64_t{h} * D, shape.dtype);
    tile.q_row_stride = q_stride_of(it);
    if (exact[task.item]) {
      tile.k = At(it.k, task.key_begin * kv_stride + int64_t{kv_head} * D, shape.dtype);
      tile.v = At(it.v, task.key_begin * kv_stride + int64_t{kv_head} * D, shape.dtype);
      tile.kv_row_stride = kv_stride;
    } else {
      const int64_t n = seg.end - seg.begin;
      const float* k = packed.get() + seg.packed + (task.key_begin - seg.begin) * D;
      tile.k = k;
      tile.v = k + n * D;
      tile.kv_row_stride = D;
    }
    tile.num_rows = static_cast<int>(std::min<int64_t>(block_rows, it.num_q - task.block_begin));
    tile.first_row = task.block_begin;
    tile.num_k = task.key_end - task.key_begin;
    tile.type = it.type;
    tile.offset = it.offset - task.key_begin;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.o = o.get() + slot * kBlockQ * D;
    tile.lse = lse.get() + slot * kBlockQ;
    rows[slot] = tile.num_rows;
    saw[slot] = exact[task.item] ? internal::ExactForwardTile(tile) : internal::ForwardTile(tile);
  };
  auto merge = [&](int64_t index, int64_t slot) {
    if (!saw[slot]) return;
    const Task& task = tasks[index];
    const FwdWorkItem& it = items[task.item];
    const int h = task.head;
    for (int i = 0; i < rows[slot]; ++i) {
      const int64_t row = task.block_begin + i;
      internal::MergeRow(D, it.o_acc + row * o_row_stride + int64_t{h} * D,
                         it.lse_acc + int64_t{h} * it.lse_stride + row,
                         o.get() + (slot * kBlockQ + i) * D, lse[slot * kBlockQ + i]);
    }
  };
  // K then V rows of each segment, side by side in the batch's buffer.
  auto pack = [&](const Segment& seg, int64_t first, int64_t n) {
    const FwdWorkItem& it = items[seg.item];
    const int64_t kv_stride = kv_stride_of(it), len = seg.end - seg.begin;
    float* k = packed.get() + seg.packed;
    const int64_t src = first * kv_stride + int64_t{seg.kv_head} * D;
    internal::PackRows(At(it.k, src, shape.dtype), shape.dtype, kv_stride, n, D, 1.f,
                       k + (first - seg.begin) * D, D);
    internal::PackRows(At(it.v, src, shape.dtype), shape.dtype, kv_stride, n, D, 1.f,
                       k + (len + first - seg.begin) * D, D);
  };
  WaveRunner runner(pool, tasks, wave, internal::WavePairs(D), compute, merge);
  for (const Batch& b : batches) {
    PackBatch(&runner, segments, b.segment_begin, b.segment_end, pack);
    if (!runner.Run(b.task_begin, b.task_end, stop)) return false;
  }
  runner.Finish();
  return true;
}

bool Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
              ThreadPool* pool, const StopFn* stop) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int group = Hq / Hkv;
  const int64_t q_row = static_cast<int64_t>(Hq) * D, kv_row = static_cast<int64_t>(Hkv) * D;
  const int Dp = internal::PackedRowLength(D);
  auto q_stride_of = [&](const BwdWorkItem& it) {
    return it.q_row_stride > 0 ? it.q_row_stride : q_row;
  };
  auto kv_stride_of = [&](const BwdWorkItem& it) {
    return it.kv_row_stride > 0 ? it.kv_row_stride : kv_row;
  };
  std::vector<char> exact(items.size(), 0);
  RunParallel(pool, static_cast<int64_t>(items.size()), [&](int64_t n) {
    const BwdWorkItem& it = items[n];
    const int e = kBackwardMaxExp;
    exact[n] = internal::HasNonFiniteOrHuge(it.q, shape.dtype, it.num_q, q_stride_of(it), q_row, e) ||
               internal::HasNonFiniteOrHuge(it.dout, shape.dtype, it.num_q, q_stride_of(it), q_row, e) ||
               internal::HasNonFiniteOrHuge(it.k, shape.dtype, it.num_k, kv_stride_of(it), kv_row, e) ||
               internal::HasNonFiniteOrHuge(it.v, shape.dtype, it.num_k, kv_stride_of(it), kv_row, e) ||
               HasBadFloats(it.lse, Hq, it.lse_stride, it.num_q, /*any_infinity=*/false) ||
               HasBadFloats(it.delta, Hq, it.lse_stride, it.num_q, /*any_infinity=*/true);
  });

  // Segments (KV head, item, aligned row chunk), in that order.
  std::vector<int64_t> first_chunk(items.size() + 1, 0);
  for (size_t n = 0; n < items.size(); ++n) {
    first_chunk[n + 1] = first_chunk[n] + (items[n].num_q + kBwdChunkRows - 1) / kBwdChunkRows;
  }
  const int64_t chunks = first_chunk.back();
  std::vector<Segment> segments(static_cast<size_t>(chunks * Hkv));
  std::vector<Task> tasks;
  for (size_t n = 0; n < items.size(); ++n) {
    const BwdWorkItem& it = items[n];
    for (int64_t k0 = 0; k0 < it.num_k; k0 += kBwdBlockK) {
      const int64_t k1 = std::min(it.num_k, k0 + kBwdBlockK);
      int64_t r0, r1;
      internal::RowsSeeingKeys(it.type, it.offset, it.window, it.num_q, it.num_k, k0, k1, &r0,
                               &r1);
      if (r0 >= r1) continue;  // no query sees these keys: no gradient
      for (int64_t ci = r0 / kBwdChunkRows; ci * kBwdChunkRows < r1; ++ci) {
        const int64_t c0 = std::max(r0, ci * kBwdChunkRows);
        const int64_t c1 = std::min(r1, (ci + 1) * kBwdChunkRows);
        for (int g = 0; g < Hkv; ++g) {
          Task t{static_cast<int32_t>(n), g, k0, group * (c1 - c0) * (k1 - k0)};
          t.row_begin = c0;
          t.row_end = c1;
          t.segment = g * chunks + first_chunk[n] + ci;
          Segment& seg = segments[t.segment];
          seg.item = static_cast<int32_t>(n);
          seg.kv_head = g;
          seg.used = true;
          if (!exact[n]) {  // exact items read Q/dO in place
            seg.begin = std::min(seg.begin, c0);
            seg.end = std::max(seg.end, c1);
          }
          tasks.push_back(t);
        }
      }
    }
  }
  int64_t packed_floats = 0;
  const std::vector<Batch> batches = MakeBatches(
      &tasks, &segments, kPackRows / group, 2 * int64_t{group} * Dp,
      [](const Segment& g) { return std::max<int64_t>(0, g.end - g.begin); }, &packed_floats);
  const auto packed = Scratch(static_cast<size_t>(packed_floats));

  const int64_t wave = std::min<int64_t>(kBackwardWave, std::max<size_t>(tasks.size(), 1));
  const size_t kv_floats = static_cast<size_t>(kBwdBlockK) * Dp;
  const size_t dq_floats = static_cast<size_t>(group) * kBwdChunkRows * Dp;
  // Two sets of slots: one wave computes while the previous one merges.
  const auto dk = Scratch(2 * wave * kv_floats), dv = Scratch(2 * wave * kv_floats),
             dq = Scratch(2 * wave * dq_floats);
  std::vector<char> saw(2 * wave, 0);
  std::vector<int> keys(2 * wave, 0);
  auto compute = [&](int64_t index, int64_t slot) {
    const Task& task = tasks[index];
    const BwdWorkItem& it = items[task.item];
    const int kv_head = task.head;
    const int num_keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, it.num_k - task.block_begin));
    keys[slot] = num_keys;
    float* slot_dq = dq.get() + slot * dq_floats;
    float* slot_dk = dk.get() + slot * kv_floats;
    float* slot_dv = dv.get() + slot * kv_floats;
    const void* k = At(it.k, int64_t{kv_head} * D, shape.dtype);
    const void* v = At(it.v, int64_t{kv_head} * D, shape.dtype);
    if (exact[task.item]) {
      // One query head at a time; dK/dV summed over the heads in fp32.
      const int64_t rows = task.row_end - task.row_begin;
      thread_local std::vector<float> head_dk, head_dv;
      head_dk.resize(kv_floats);
      head_dv.resize(kv_floats);
      bool any = false;
      for (int j = 0; j < group; ++j) {
        const int h = kv_head * group + j;
        internal::ExactBwdTile tile;
        tile.q = At(it.q, int64_t{h} * D, shape.dtype);
        tile.dout = At(it.dout, int64_t{h} * D, shape.dtype);
        tile.lse = it.lse + int64_t{h} * it.lse_stride;
        tile.delta = it.delta + int64_t{h} * it.lse_stride;
        tile.q_row_stride = q_stride_of(it);
        tile.k = k;
        tile.v = v;
        tile.kv_row_stride = kv_stride_of(it);
        tile.num_q = it.num_q;
        tile.num_k = it.num_k;
        tile.first_key = task.block_begin;
        tile.num_keys = num_keys;
        tile.row_begin = task.row_begin;
        tile.row_end = task.row_end;
        tile.type = it.type;
        tile.offset = it.offset;
        tile.window = it.window;
        tile.head_dim = D;
        tile.dtype = shape.dtype;
        tile.softmax_scale = shape.softmax_scale;
        tile.out_row_stride = Dp;
        tile.dq = slot_dq + j * rows * Dp;
        tile.dk = j == 0 ? slot_dk : head_dk.data();
        tile.dv = j == 0 ? slot_dv : head_dv.data();
        any |= internal::ExactBackwardTile(tile);
        if (j > 0) {
          internal::AddRows(slot_dk, Dp, head_dk.data(), Dp, num_keys, Dp);
          internal::AddRows(slot_dv, Dp, head_dv.data(), Dp, num_keys, Dp);
        }
      }
      saw[slot] = any;
      return;
    }
    const Segment& seg = segments[task.segment];
    const int64_t len = seg.end - seg.begin;
    const float* q = packed.get() + seg.packed;
    internal::BwdTile tile;
    tile.heads = group;
    tile.q = q + (task.row_begin - seg.begin) * Dp;
    tile.dout = q + int64_t{group} * len * Dp + (task.row_begin - seg.begin) * Dp;
    tile.head_stride = len * Dp;
    tile.lse = it.lse + int64_t{kv_head} * group * it.lse_stride;
    tile.delta = it.delta + int64_t{kv_head} * group * it.lse_stride;
    tile.lse_head_stride = it.lse_stride;
    tile.k = k;
    tile.v = v;
    tile.kv_row_stride = kv_stride_of(it);
    tile.num_q = it.num_q;
    tile.num_k = it.num_k;
    tile.first_key = task.block_begin;
    tile.num_keys = num_keys;
    tile.row_begin = task.row_begin;
    tile.row_end = task.row_end;
    tile.type = it.type;
    tile.offset = it.offset;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.dq = slot_dq;
    tile.dk = slot_dk;
    tile.dv = slot_dv;
    saw[slot] = internal::BackwardTile(tile);
  };
  auto merge = [&](int64_t index, int64_t slot) {
    if (!saw[slot]) return;
    const Task& task = tasks[index];
    const BwdWorkItem& it = items[task.item];
    const int kv_head = task.head;
    const int64_t rows = task.row_end - task.row_begin;
    for (int j = 0; j < group; ++j) {
      const int h = kv_head * group + j;
      internal::AddRows(it.dq_acc + task.row_begin * q_row + int64_t{h} * D, q_row,
                        dq.get() + slot * dq_floats + j * rows * Dp, Dp, rows, D);
    }
    const int64_t first = task.block_begin * kv_row + int64_t{kv_head} * D;
    internal::AddRows(it.dk_acc + first, kv_row, dk.get() + slot * kv_floats, Dp, keys[slot], D);
    internal::AddRows(it.dv_acc + first, kv_row, dv.get() + slot * kv_floats, Dp, keys[slot], D);
  };
  // Per segment: Q (scaled into base-2 logits) of each query head of the KV
  // head, then dO of each, rows of Dp floats.
  const float c = shape.softmax_scale * 1.4426950408889634f;
  auto pack = [&](const Segment& seg, int64_t first, int64_t n) {
    const BwdWorkItem& it = items[seg.item];
    const int64_t q_stride = q_stride_of(it), len = seg.end - seg.begin;
    float* base = packed.get() + seg.packed + (first - seg.begin) * Dp;
    for (int j = 0; j < group; ++j) {
      const int64_t src = first * q_stride + int64_t{seg.kv_head * group + j} * D;
      internal::PackRows(At(it.q, src, shape.dtype), shape.dtype, q_stride, n, D, c,
                         base + j * len * Dp, Dp);
      internal::PackRows(At(it.dout, src, shape.dtype), shape.dtype, q_stride, n, D, 1.f,
                         base + (group + j) * len * Dp, Dp);
    }
  };
  WaveRunner runner(pool, tasks, wave, internal::WavePairs(D), compute, merge);
  for (const Batch& b : batches) {
    PackBatch(&runner, segments, b.segment_begin, b.segment_end, pack);
    if (!runner.Run(b.task_begin, b.task_end, stop)) return false;
  }
  runner.Finish();
  return true;
}

void ComputeDelta(const AttentionShape& shape, const void* o, const void* dout,
                  int64_t num_tokens, float* delta, int64_t lse_stride, ThreadPool* pool) {
  const int Hq = shape.num_heads_q, D = shape.head_dim;
  constexpr int64_t kTokensPerTask = 64;
  const int64_t tasks = (num_tokens + kTokensPerTask - 1) / kTokensPerTask;
  RunParallel(pool, tasks, [&](int64_t task) {
    thread_local std::vector<float> a, b;
    a.resize(D);
    b.resize(D);
    const int64_t t1 = std::min(num_tokens, (task + 1) * kTokensPerTask);
    for (int64_t t = task * kTokensPerTask; t < t1; ++t) {
      for (int h = 0; h < Hq; ++h) {
        const int64_t first = (t * Hq + h) * static_cast<int64_t>(D);
        const float* x = a.data();
        const float* y = b.data();
        if (shape.dtype == DType::kFloat32) {  // in place: no copy per row
          x = static_cast<const float*>(o) + first;
          y = static_cast<const float*>(dout) + first;
        } else {
          internal::ConvertToFloat(o, shape.dtype, first, D, a.data());
          internal::ConvertToFloat(dout, shape.dtype, first, D, b.data());
        }
        float sum = 0.f;
        for (int d = 0; d < D; ++d) sum += x[d] * y[d];
        delta[h * lse_stride + t] = sum;
      }
    }
  });
}

void MergePartial(int num_heads, int head_dim, int64_t num_rows, float* o_a, float* lse_a,
                  const float* o_b, const float* lse_b, int64_t lse_stride) {
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int h = 0; h < num_heads; ++h) {
      const int64_t off = (r * num_heads + h) * static_cast<int64_t>(head_dim);
      internal::MergeRow(head_dim, o_a + off, lse_a + h * lse_stride + r, o_b + off,
                         lse_b[h * lse_stride + r]);
    }
  }
}

void SetScratchCacheLimit(size_t bytes) { internal::SetScratchCacheLimit(bytes); }

size_t ScratchCacheBytes() { return internal::CachedScratchBytes(); }

void CastFromFloat(const float* src, int64_t n, DType dtype, void* dst, ThreadPool* pool) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  RunParallel(pool, chunks, [&](int64_t c) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    switch (dtype) {
      case DType::kFloat32:
        std::copy(src + i0, src + i1, static_cast<float*>(dst) + i0);
        break;
      case DType::kBFloat16:
        for (int64_t i = i0; i < i1; ++i) static_cast<uint16_t*>(dst)[i] = FloatToBf16(src[i]);
        break;
      case DType::kFloat16:
        for (int64_t i = i0; i < i1; ++i) static_cast<uint16_t*>(dst)[i] = FloatToFp16(src[i]);
        break;
    }
  });
}

void VarlenForward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                   int64_t num_q, int64_t num_k, absl::Span<const MaskSlice> slices, void* o,
                   float* lse, ThreadPool* pool) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int64_t q_row = int64_t{Hq} * D, kv_row = int64_t{Hkv} * D;
  // fp32 output is its own accumulator.
  ScratchPtr o_storage;
  float* o_acc = static_cast<float*>(o);
  if (shape.dtype != DType::kFloat32) {
    o_storage = Scratch(static_cast<size_t>(num_q * q_row));
    o_acc = o_storage.get();
  }
  FillParallel(o_acc, num_q * q_row, 0.f, pool);
  FillParallel(lse, int64_t{Hq} * num_q, kNegInf, pool);
  std::vector<FwdWorkItem> items;
  for (const MaskSlice& s : slices) {
    if (s.num_q() <= 0 || s.num_k() <= 0) continue;
    FwdWorkItem it;
    it.q = At(q, s.q_begin * q_row, shape.dtype);
    it.k = At(k, s.k_begin * kv_row, shape.dtype);
    it.v = At(v, s.k_begin * kv_row, shape.dtype);
    it.num_q = s.num_q();
    it.num_k = s.num_k();
    it.type = s.type;
    it.offset = s.offset;
    it.window = s.window;
    it.o_acc = o_acc + s.q_begin * q_row;
    it.lse_acc = lse + s.q_begin;
    it.lse_stride = num_q;
    items.push_back(it);
  }
  Forward(shape, items, pool);
  if (shape.dtype != DType::kFloat32) CastFromFloat(o_acc, num_q * q_row, shape.dtype, o, pool);
}

void VarlenBackward(const AttentionShape& shape, const void* q, const void* k, const void* v,
                    const void* o, const float* lse, const void* dout, int64_t num_q,
                    int64_t num_k, absl::Span<const MaskSlice> slices, void* dq, void* dk,
                    void* dv, ThreadPool* pool) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int64_t q_row = int64_t{Hq} * D, kv_row = int64_t{Hkv} * D;
  const auto delta = Scratch(static_cast<size_t>(int64_t{Hq} * num_q));  // every entry written
  ComputeDelta(shape, o, dout, num_q, delta.get(), num_q, pool);
  const bool fp32 = shape.dtype == DType::kFloat32;
  ScratchPtr dq_storage, dk_storage, dv_storage;
  auto accumulator = [&](void* out, int64_t n, ScratchPtr* storage) {
    float* acc = static_cast<float*>(out);
    if (!fp32) {
      *storage = Scratch(static_cast<size_t>(n));
      acc = storage->get();
    }
    FillParallel(acc, n, 0.f, pool);
    return acc;
  };
  float* dq_acc = accumulator(dq, num_q * q_row, &dq_storage);
  float* dk_acc = accumulator(dk, num_k * kv_row, &dk_storage);
  float* dv_acc = accumulator(dv, num_k * kv_row, &dv_storage);
  std::vector<BwdWorkItem> items;
  for (const MaskSlice& s : slices) {
    if (s.num_q() <= 0 || s.num_k() <= 0) continue;
    BwdWorkItem it;
    it.q = At(q, s.q_begin * q_row, shape.dtype);
    it.k = At(k, s.k_begin * kv_row, shape.dtype);
    it.v = At(v, s.k_begin * kv_row, shape.dtype);
    it.dout = At(dout, s.q_begin * q_row, shape.dtype);
    it.lse = lse + s.q_begin;
    it.delta = delta.get() + s.q_begin;
    it.lse_stride = num_q;
    it.num_q = s.num_q();
    it.num_k = s.num_k();
    it.type = s.type;
    it.offset = s.offset;
    it.window = s.window;
    it.dq_acc = dq_acc + s.q_begin * q_row;
    it.dk_acc = dk_acc + s.k_begin * kv_row;
    it.dv_acc = dv_acc + s.k_begin * kv_row;
    items.push_back(it);
  }
  Backward(shape, items, pool);
  if (!fp32) {
    CastFromFloat(dq_acc, num_q * q_row, shape.dtype, dq, pool);
    CastFromFloat(dk_acc, num_k * kv_row, shape.dtype, dk, pool);
    CastFromFloat(dv_acc, num_k * kv_row, shape.dtype, dv, pool);
  }
}

}  // namespace hsap::kernels::cpu

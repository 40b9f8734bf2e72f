// Work-item scheduling for the CPU attention kernels (attention.h).
//
// Forward: one task per (item, query head, block of kBlockQ rows). Backward
// (FlashAttention-2 order): one task per (item, query head, block of
// kBwdBlockK keys, chunk of at most kBwdChunkRows of the query rows that see
// them). A task computes its tile into private buffers.
//
// Determinism: tasks are put in one canonical order (grouped by KV head for
// cache locality, largest first within a head so the waves stay balanced)
// and run in waves of a fixed number of tasks: the tiles of a wave are
// computed in parallel, then merged into the accumulators one task after
// another in that order. Every accumulator element therefore receives its
// contributions in the same order whatever the number of threads, and the
// result is bitwise the same on every run.
//
// Non-finite inputs: an item whose Q, K, V (backward also dO, Delta, LSE)
// are not all finite runs on the exact tiles (exact_tiles.cc), which touch
// allowed pairs only, in float64.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "kernels/cpu/tile_kernels.h"

namespace hsap::kernels::cpu {
namespace {

using internal::kBwdBlockK;
using internal::kBlockQ;

// Waves hold at most this many tasks, and (beyond their first task) at most
// this many allowed pairs: constants, so the merge order never depends on
// the pool, and small enough that a wave takes a few milliseconds — the
// quantum at which concurrent calls on one pool take turns (ThreadPool
// serves callers first come, first served).
constexpr int64_t kForwardWave = 64;
constexpr int64_t kBackwardWave = 32;
constexpr int64_t kWavePairs = int64_t{1} << 21;
// Keys a forward task streams at most (a longer range is cut into chunks
// whose partial results merge in order).
constexpr int64_t kFwdKeyChunk = 4096;
// Query rows a backward task visits at most (bounds its private dQ buffer).
constexpr int64_t kBwdChunkRows = 512;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void RunParallel(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

const char* At(const void* base, int64_t elements, DType dtype) {
  return static_cast<const char*>(base) + elements * DTypeSize(dtype);
}

struct Task {
  int32_t item;
  int32_t head;
  int64_t block_begin;  // first query row (forward) or key (backward) of the tile
  int64_t cost;         // allowed (q, k) pairs, an upper estimate
  int64_t row_begin = 0, row_end = 0;  // backward: the query rows visited
  int64_t key_begin = 0, key_end = 0;  // forward: the key chunk streamed
};

// Runs `tasks` in waves of at most `wave` tasks and kWavePairs pairs:
// compute(index, slot) for a wave's tasks in parallel (slot in [0, wave)
// names the task's private buffers), then merge(index, slot) for each of
// them in index order. Before each wave `stop` (may be null) is asked
// whether to go on; returns false when it said stop.
bool RunInWaves(ThreadPool* pool, const std::vector<Task>& tasks, int64_t wave,
                const std::function<void(int64_t, int64_t)>& compute,
                const std::function<void(int64_t, int64_t)>& merge, const StopFn* stop) {
  const int64_t n = static_cast<int64_t>(tasks.size());
  for (int64_t first = 0; first < n;) {
    if (stop != nullptr && *stop && (*stop)()) return false;
    int64_t count = 1, pairs = tasks[first].cost;
    while (count < wave && first + count < n && pairs + tasks[first + count].cost <= kWavePairs) {
      pairs += tasks[first + count].cost;
      ++count;
    }
    RunParallel(pool, count, [&](int64_t slot) { compute(first + slot, slot); });
    for (int64_t slot = 0; slot < count; ++slot) merge(first + slot, slot);
    first += count;
  }
  return true;
}

// Whether rows [0, rows) x [0, cols) of a tensor with `row_stride`
// (elements) hold a NaN, an infinity, or a value of magnitude 2^max_exp or
// more (whose products could overflow the fast tiles' fp32 arithmetic; fp16
// cannot hold such values). One compare of the exponent field per element.
bool HasNonFiniteOrHuge(const void* base, DType dtype, int64_t rows, int64_t row_stride,
                        int64_t cols, int max_exp) {
  if (base == nullptr) return false;
  const uint32_t f32_limit = static_cast<uint32_t>(std::min(255, 127 + max_exp)) << 23;
  const uint16_t bf16_limit = static_cast<uint16_t>(std::min(255, 127 + max_exp) << 7);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = r * row_stride;
    switch (dtype) {
      case DType::kFloat32: {
        const uint32_t* p = static_cast<const uint32_t*>(base) + first;
        for (int64_t c = 0; c < cols; ++c) {
          if ((p[c] & 0x7f800000u) >= f32_limit) return true;
        }
        break;
      }
      case DType::kBFloat16: {
        const uint16_t* p = static_cast<const uint16_t*>(base) + first;
        for (int64_t c = 0; c < cols; ++c) {
          if ((p[c] & 0x7f80u) >= bf16_limit) return true;
        }
        break;
      }
      case DType::kFloat16: {
        const uint16_t* p = static_cast<const uint16_t*>(base) + first;
        for (int64_t c = 0; c < cols; ++c) {
          if ((p[c] & 0x7c00u) == 0x7c00u) return true;
        }
        break;
      }
    }
  }
  return false;
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

// Tasks of one KV head run together (their K/V, or Q/dO, stay in the
// last-level cache instead of streaming every head's data at once); within a
// head the most expensive go first, so the cheap ones fill the gaps at the end.
void SortForLocalityAndBalance(std::vector<Task>* tasks, int group) {
  std::stable_sort(tasks->begin(), tasks->end(), [group](const Task& a, const Task& b) {
    if (a.head / group != b.head / group) return a.head / group < b.head / group;
    return a.cost > b.cost;
  });
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
  std::vector<Task> tasks;
  for (size_t n = 0; n < items.size(); ++n) {
    const FwdWorkItem& it = items[n];
    for (int64_t r0 = 0; r0 < it.num_q; r0 += kBlockQ) {
      const int64_t r1 = std::min(it.num_q, r0 + kBlockQ);
      int64_t k0, k1;
      internal::KeysSeenByRows(it.type, it.offset, it.window, it.num_k, r0, r1, &k0, &k1);
      if (k0 >= k1) continue;  // these rows see nothing: accumulators stay as they are
      for (int64_t c0 = k0; c0 < k1; c0 += kFwdKeyChunk) {
        const int64_t c1 = std::min(k1, c0 + kFwdKeyChunk);
        for (int h = 0; h < Hq; ++h) {
          Task t{static_cast<int32_t>(n), h, r0, (r1 - r0) * (c1 - c0)};
          t.key_begin = c0;
          t.key_end = c1;
          tasks.push_back(t);
        }
      }
    }
  }
  SortForLocalityAndBalance(&tasks, group);
  // Items whose inputs are not all finite, or large enough to overflow fp32
  // products, run on the exact (float64) tiles.
  std::vector<char> exact(items.size(), 0);
  RunParallel(pool, static_cast<int64_t>(items.size()), [&](int64_t n) {
    const FwdWorkItem& it = items[n];
    const int64_t q_stride = it.q_row_stride > 0 ? it.q_row_stride : o_row_stride;
    const int64_t kv_stride = it.kv_row_stride > 0 ? it.kv_row_stride : int64_t{Hkv} * D;
    const int e = kForwardMaxExp;
    exact[n] = HasNonFiniteOrHuge(it.q, shape.dtype, it.num_q, q_stride, int64_t{Hq} * D, e) ||
               HasNonFiniteOrHuge(it.k, shape.dtype, it.num_k, kv_stride, int64_t{Hkv} * D, e) ||
               HasNonFiniteOrHuge(it.v, shape.dtype, it.num_k, kv_stride, int64_t{Hkv} * D, e);
  });
  const int64_t wave = std::min<int64_t>(kForwardWave, std::max<size_t>(tasks.size(), 1));
  std::vector<float> o(static_cast<size_t>(wave) * kBlockQ * D), lse(wave * kBlockQ);
  std::vector<char> saw(wave, 0);
  std::vector<int> rows(wave, 0);
  auto compute = [&](int64_t index, int64_t slot) {
    const Task& task = tasks[index];
    const FwdWorkItem& it = items[task.item];
    const int h = task.head, kv_head = h / group;
    const int64_t q_stride = it.q_row_stride > 0 ? it.q_row_stride : o_row_stride;
    const int64_t kv_stride = it.kv_row_stride > 0 ? it.kv_row_stride : int64_t{Hkv} * D;
    internal::FwdTile tile;
    // The key chunk [key_begin, key_end) as an item of its own: rows and
    // pointers shifted, the causal diagonal moved with them.
    tile.q = At(it.q, task.block_begin * q_stride + int64_t{h} * D, shape.dtype);
    tile.k = At(it.k, task.key_begin * kv_stride + int64_t{kv_head} * D, shape.dtype);
    tile.v = At(it.v, task.key_begin * kv_stride + int64_t{kv_head} * D, shape.dtype);
    tile.q_row_stride = q_stride;
    tile.kv_row_stride = kv_stride;
    tile.num_rows = static_cast<int>(std::min<int64_t>(kBlockQ, it.num_q - task.block_begin));
    tile.first_row = task.block_begin;
    tile.num_k = task.key_end - task.key_begin;
    tile.type = it.type;
    tile.offset = it.offset - task.key_begin;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.o = o.data() + slot * kBlockQ * D;
    tile.lse = lse.data() + slot * kBlockQ;
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
                         o.data() + (slot * kBlockQ + i) * D, lse[slot * kBlockQ + i]);
    }
  };
  return RunInWaves(pool, tasks, wave, compute, merge, stop);
}

bool Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
              ThreadPool* pool, const StopFn* stop) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int group = Hq / Hkv;
  const int64_t q_row = static_cast<int64_t>(Hq) * D, kv_row = static_cast<int64_t>(Hkv) * D;
  std::vector<Task> tasks;
  for (size_t n = 0; n < items.size(); ++n) {
    const BwdWorkItem& it = items[n];
    for (int64_t k0 = 0; k0 < it.num_k; k0 += kBwdBlockK) {
      const int64_t k1 = std::min(it.num_k, k0 + kBwdBlockK);
      int64_t r0, r1;
      internal::RowsSeeingKeys(it.type, it.offset, it.window, it.num_q, it.num_k, k0, k1, &r0,
                               &r1);
      if (r0 >= r1) continue;  // no query sees these keys: no gradient
      for (int64_t c0 = r0; c0 < r1; c0 += kBwdChunkRows) {
        const int64_t c1 = std::min(r1, c0 + kBwdChunkRows);
        for (int h = 0; h < Hq; ++h) {
          Task t{static_cast<int32_t>(n), h, k0, (c1 - c0) * (k1 - k0)};
          t.row_begin = c0;
          t.row_end = c1;
          tasks.push_back(t);
        }
      }
    }
  }
  SortForLocalityAndBalance(&tasks, group);
  std::vector<char> exact(items.size(), 0);
  RunParallel(pool, static_cast<int64_t>(items.size()), [&](int64_t n) {
    const BwdWorkItem& it = items[n];
    const int64_t q_stride = it.q_row_stride > 0 ? it.q_row_stride : q_row;
    const int64_t kv_stride = it.kv_row_stride > 0 ? it.kv_row_stride : kv_row;
    const int e = kBackwardMaxExp;
    exact[n] = HasNonFiniteOrHuge(it.q, shape.dtype, it.num_q, q_stride, q_row, e) ||
               HasNonFiniteOrHuge(it.dout, shape.dtype, it.num_q, q_stride, q_row, e) ||
               HasNonFiniteOrHuge(it.k, shape.dtype, it.num_k, kv_stride, kv_row, e) ||
               HasNonFiniteOrHuge(it.v, shape.dtype, it.num_k, kv_stride, kv_row, e) ||
               HasBadFloats(it.lse, Hq, it.lse_stride, it.num_q, /*any_infinity=*/false) ||
               HasBadFloats(it.delta, Hq, it.lse_stride, it.num_q, /*any_infinity=*/true);
  });
  const int64_t wave = std::min<int64_t>(kBackwardWave, std::max<size_t>(tasks.size(), 1));
  const size_t kv_floats = static_cast<size_t>(kBwdBlockK) * D;
  const size_t dq_floats = static_cast<size_t>(kBwdChunkRows) * D;
  std::vector<float> dk(wave * kv_floats), dv(wave * kv_floats), dq(wave * dq_floats);
  std::vector<char> saw(wave, 0);
  std::vector<int> keys(wave, 0);
  auto compute = [&](int64_t index, int64_t slot) {
    const Task& task = tasks[index];
    const BwdWorkItem& it = items[task.item];
    const int h = task.head, kv_head = h / group;
    internal::BwdTile tile;
    tile.q = At(it.q, int64_t{h} * D, shape.dtype);
    tile.dout = At(it.dout, int64_t{h} * D, shape.dtype);
    tile.lse = it.lse + int64_t{h} * it.lse_stride;
    tile.delta = it.delta + int64_t{h} * it.lse_stride;
    tile.q_row_stride = it.q_row_stride > 0 ? it.q_row_stride : q_row;
    tile.k = At(it.k, int64_t{kv_head} * D, shape.dtype);
    tile.v = At(it.v, int64_t{kv_head} * D, shape.dtype);
    tile.kv_row_stride = it.kv_row_stride > 0 ? it.kv_row_stride : kv_row;
    tile.num_q = it.num_q;
    tile.num_k = it.num_k;
    tile.first_key = task.block_begin;
    tile.num_keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, it.num_k - task.block_begin));
    tile.row_begin = task.row_begin;
    tile.row_end = task.row_end;
    tile.type = it.type;
    tile.offset = it.offset;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.dq = dq.data() + slot * dq_floats;
    tile.dk = dk.data() + slot * kv_floats;
    tile.dv = dv.data() + slot * kv_floats;
    keys[slot] = tile.num_keys;
    saw[slot] =
        exact[task.item] ? internal::ExactBackwardTile(tile) : internal::BackwardTile(tile);
  };
  auto merge = [&](int64_t index, int64_t slot) {
    if (!saw[slot]) return;
    const Task& task = tasks[index];
    const BwdWorkItem& it = items[task.item];
    const int h = task.head, kv_head = h / group;
    internal::AddRows(it.dq_acc + task.row_begin * q_row + int64_t{h} * D, q_row,
                      dq.data() + slot * dq_floats, D, task.row_end - task.row_begin, D);
    const int64_t first = task.block_begin * kv_row + int64_t{kv_head} * D;
    internal::AddRows(it.dk_acc + first, kv_row, dk.data() + slot * kv_floats, D, keys[slot], D);
    internal::AddRows(it.dv_acc + first, kv_row, dv.data() + slot * kv_floats, D, keys[slot], D);
  };
  return RunInWaves(pool, tasks, wave, compute, merge, stop);
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
        internal::ConvertToFloat(o, shape.dtype, first, D, a.data());
        internal::ConvertToFloat(dout, shape.dtype, first, D, b.data());
        float sum = 0.f;
        for (int d = 0; d < D; ++d) sum += a[d] * b[d];
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
  std::vector<float> o_storage;
  float* o_acc = static_cast<float*>(o);
  if (shape.dtype != DType::kFloat32) {
    o_storage.resize(static_cast<size_t>(num_q * q_row));
    o_acc = o_storage.data();
  }
  std::fill(o_acc, o_acc + num_q * q_row, 0.f);
  std::fill(lse, lse + int64_t{Hq} * num_q, kNegInf);
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
  std::vector<float> delta(static_cast<size_t>(int64_t{Hq} * num_q));
  ComputeDelta(shape, o, dout, num_q, delta.data(), num_q, pool);
  const bool fp32 = shape.dtype == DType::kFloat32;
  std::vector<float> dq_storage, dk_storage, dv_storage;
  auto accumulator = [&](void* out, int64_t n, std::vector<float>* storage) {
    float* acc = static_cast<float*>(out);
    if (!fp32) {
      storage->resize(static_cast<size_t>(n));
      acc = storage->data();
    }
    std::fill(acc, acc + n, 0.f);
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
    it.delta = delta.data() + s.q_begin;
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

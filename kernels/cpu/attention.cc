// Work-item scheduling for the CPU attention kernels (attention.h).
//
// Forward: one task per (item, query head, block of kBlockQ rows); each task
// computes its tile's partial (O, LSE) privately and merges it row by row
// into the accumulators under RowLocks, so items that share accumulator
// rows (several key ranges for the same queries) never race.
//
// Backward (FlashAttention-2 order): one task per (item, query head, block of
// kBwdBlockK keys). A task owns its key block's dK/dV while it runs and adds
// them once at the end; dQ contributions of each (key block, query block)
// pair are added under RowLocks. GQA query heads of one KV head are separate
// tasks that add into the same dK/dV rows, so K/V are never repeated.
//
// Tasks are grouped by KV head (cache locality) and sorted by estimated cost,
// largest first, within a head; the pool hands them out dynamically, which
// keeps the causal triangle balanced.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/tile_kernels.h"

namespace hsap::kernels::cpu {
namespace {

using internal::kBwdBlockK;
using internal::kBlockQ;

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
};

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

void Forward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items, ThreadPool* pool) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int group = Hq / Hkv;
  std::vector<Task> tasks;
  for (size_t n = 0; n < items.size(); ++n) {
    const FwdWorkItem& it = items[n];
    for (int64_t r0 = 0; r0 < it.num_q; r0 += kBlockQ) {
      const int64_t r1 = std::min(it.num_q, r0 + kBlockQ);
      int64_t k0, k1;
      internal::KeysSeenByRows(it.type, it.offset, it.window, it.num_k, r0, r1, &k0, &k1);
      if (k0 >= k1) continue;  // these rows see nothing: accumulators stay as they are
      for (int h = 0; h < Hq; ++h) {
        tasks.push_back({static_cast<int32_t>(n), h, r0, (r1 - r0) * (k1 - k0)});
      }
    }
  }
  SortForLocalityAndBalance(&tasks, group);
  internal::RowLocks locks;
  const int64_t o_row_stride = static_cast<int64_t>(Hq) * D;
  RunParallel(pool, static_cast<int64_t>(tasks.size()), [&](int64_t index) {
    const Task& task = tasks[index];
    const FwdWorkItem& it = items[task.item];
    const int h = task.head, kv_head = h / group;
    const int64_t q_stride = it.q_row_stride > 0 ? it.q_row_stride : o_row_stride;
    const int64_t kv_stride = it.kv_row_stride > 0 ? it.kv_row_stride : int64_t{Hkv} * D;
    thread_local std::vector<float> o, lse;
    o.resize(static_cast<size_t>(kBlockQ) * D);
    lse.resize(kBlockQ);
    internal::FwdTile tile;
    tile.q = At(it.q, task.block_begin * q_stride + int64_t{h} * D, shape.dtype);
    tile.k = At(it.k, int64_t{kv_head} * D, shape.dtype);
    tile.v = At(it.v, int64_t{kv_head} * D, shape.dtype);
    tile.q_row_stride = q_stride;
    tile.kv_row_stride = kv_stride;
    tile.num_rows = static_cast<int>(std::min<int64_t>(kBlockQ, it.num_q - task.block_begin));
    tile.first_row = task.block_begin;
    tile.num_k = it.num_k;
    tile.type = it.type;
    tile.offset = it.offset;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.o = o.data();
    tile.lse = lse.data();
    if (!internal::ForwardTile(tile)) return;
    for (int i = 0; i < tile.num_rows; ++i) {
      const int64_t row = task.block_begin + i;
      float* o_acc = it.o_acc + row * o_row_stride + int64_t{h} * D;
      float* lse_acc = it.lse_acc + int64_t{h} * it.lse_stride + row;
      std::lock_guard<std::mutex> lock(locks.For(o_acc));
      internal::MergeRow(D, o_acc, lse_acc, o.data() + int64_t{i} * D, lse[i]);
    }
  });
}

void Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
              ThreadPool* pool) {
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int group = Hq / Hkv;
  std::vector<Task> tasks;
  for (size_t n = 0; n < items.size(); ++n) {
    const BwdWorkItem& it = items[n];
    for (int64_t k0 = 0; k0 < it.num_k; k0 += kBwdBlockK) {
      const int64_t k1 = std::min(it.num_k, k0 + kBwdBlockK);
      int64_t r0, r1;
      internal::RowsSeeingKeys(it.type, it.offset, it.window, it.num_q, it.num_k, k0, k1, &r0,
                               &r1);
      if (r0 >= r1) continue;  // no query sees these keys: no gradient
      for (int h = 0; h < Hq; ++h) {
        tasks.push_back({static_cast<int32_t>(n), h, k0, (r1 - r0) * (k1 - k0)});
      }
    }
  }
  SortForLocalityAndBalance(&tasks, group);
  internal::RowLocks locks;
  const int64_t q_row = static_cast<int64_t>(Hq) * D, kv_row = static_cast<int64_t>(Hkv) * D;
  RunParallel(pool, static_cast<int64_t>(tasks.size()), [&](int64_t index) {
    const Task& task = tasks[index];
    const BwdWorkItem& it = items[task.item];
    const int h = task.head, kv_head = h / group;
    const int64_t q_stride = it.q_row_stride > 0 ? it.q_row_stride : q_row;
    const int64_t kv_stride = it.kv_row_stride > 0 ? it.kv_row_stride : kv_row;
    thread_local std::vector<float> dk, dv;
    dk.resize(static_cast<size_t>(kBwdBlockK) * D);
    dv.resize(static_cast<size_t>(kBwdBlockK) * D);
    internal::BwdTile tile;
    tile.q = At(it.q, int64_t{h} * D, shape.dtype);
    tile.dout = At(it.dout, int64_t{h} * D, shape.dtype);
    tile.lse = it.lse + int64_t{h} * it.lse_stride;
    tile.delta = it.delta + int64_t{h} * it.lse_stride;
    tile.q_row_stride = q_stride;
    tile.k = At(it.k, int64_t{kv_head} * D, shape.dtype);
    tile.v = At(it.v, int64_t{kv_head} * D, shape.dtype);
    tile.kv_row_stride = kv_stride;
    tile.num_q = it.num_q;
    tile.num_k = it.num_k;
    tile.first_key = task.block_begin;
    tile.num_keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, it.num_k - task.block_begin));
    tile.type = it.type;
    tile.offset = it.offset;
    tile.window = it.window;
    tile.head_dim = D;
    tile.dtype = shape.dtype;
    tile.softmax_scale = shape.softmax_scale;
    tile.dq_acc = it.dq_acc + int64_t{h} * D;
    tile.dq_row_stride = q_row;
    tile.locks = &locks;
    tile.dk = dk.data();
    tile.dv = dv.data();
    if (!internal::BackwardTile(tile)) return;
    const int64_t first = task.block_begin * kv_row + int64_t{kv_head} * D;
    internal::AddRowsLocked(&locks, it.dk_acc + first, kv_row, dk.data(), D, tile.num_keys, D,
                            1.f);
    internal::AddRowsLocked(&locks, it.dv_acc + first, kv_row, dv.data(), D, tile.num_keys, D,
                            1.f);
  });
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

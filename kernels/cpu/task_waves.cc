#include "kernels/cpu/task_waves.h"

#include <algorithm>

namespace hsap::kernels::cpu::internal {

void RunParallel(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

std::vector<Batch> MakeBatches(std::vector<Task>* tasks, std::vector<Segment>* segments,
                               int64_t limit, int64_t floats_per_row,
                               const std::function<int64_t(const Segment&)>& rows,
                               int64_t* max_batch_floats) {
  std::stable_sort(tasks->begin(), tasks->end(),
                   [](const Task& a, const Task& b) { return a.segment < b.segment; });
  std::vector<Batch> batches;
  *max_batch_floats = 0;
  int64_t batch_rows = 0;
  size_t t = 0;
  for (size_t g = 0; g < segments->size(); ++g) {
    Segment& seg = (*segments)[g];
    if (!seg.used) continue;
    const int64_t n = rows(seg);
    if (batches.empty() || (batch_rows > 0 && batch_rows + n > limit)) {
      batches.push_back({t, t, static_cast<int64_t>(g), static_cast<int64_t>(g)});
      batch_rows = 0;
    }
    seg.packed = batch_rows * floats_per_row;
    batch_rows += n;
    *max_batch_floats = std::max(*max_batch_floats, batch_rows * floats_per_row);
    while (t < tasks->size() && (*tasks)[t].segment == static_cast<int64_t>(g)) ++t;
    batches.back().task_end = t;
    batches.back().segment_end = static_cast<int64_t>(g) + 1;
  }
  for (const Batch& b : batches) {
    // Largest first; among equals, tiles of the same query block (forward) or
    // key block (backward) next to each other, so that its rows are still in
    // cache when the next one needs them.
    std::stable_sort(tasks->begin() + b.task_begin, tasks->begin() + b.task_end,
                     [](const Task& x, const Task& y) {
                       if (x.cost != y.cost) return x.cost > y.cost;
                       return x.block_begin < y.block_begin;
                     });
  }
  return batches;
}

void WaveRunner::Parallel(int64_t n, const std::function<void(int64_t)>& job) {
  const int64_t extra = pending_count_ > 0 ? 1 : 0;
  RunParallel(pool_, n + extra, [&](int64_t i) {
    if (i < extra) {
      for (int64_t s = 0; s < pending_count_; ++s) merge_(pending_first_ + s, pending_slot_ + s);
    } else {
      job(i - extra);
    }
  });
  pending_count_ = 0;
}

bool WaveRunner::Run(size_t begin, size_t end, const StopFn* stop) {
  const int64_t n = static_cast<int64_t>(end);
  for (int64_t first = static_cast<int64_t>(begin); first < n;) {
    if (stop != nullptr && *stop && (*stop)()) {
      Finish();
      return false;
    }
    int64_t count = 1, pairs = tasks_[first].cost;
    while (count < wave_ && first + count < n &&
           pairs + tasks_[first + count].cost <= wave_pairs_) {
      pairs += tasks_[first + count].cost;
      ++count;
    }
    const int64_t slot = parity_ * wave_;
    parity_ ^= 1;
    Parallel(count, [&](int64_t i) { compute_(first + i, slot + i); });
    pending_first_ = first;
    pending_count_ = count;
    pending_slot_ = slot;
    first += count;
  }
  return true;
}

void PackBatch(WaveRunner* runner, const std::vector<Segment>& segments, int64_t seg_begin,
               int64_t seg_end, const std::function<void(const Segment&, int64_t, int64_t)>& fn) {
  constexpr int64_t kPiece = 256;
  struct Piece {
    int64_t segment, first, rows;
  };
  std::vector<Piece> pieces;
  for (int64_t g = seg_begin; g < seg_end; ++g) {
    const Segment& seg = segments[g];
    if (!seg.used) continue;
    for (int64_t r = seg.begin; r < seg.end; r += kPiece) {
      pieces.push_back({g, r, std::min(kPiece, seg.end - r)});
    }
  }
  runner->Parallel(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    fn(segments[pieces[i].segment], pieces[i].first, pieces[i].rows);
  });
}

}  // namespace hsap::kernels::cpu::internal

// Internal to kernels/cpu: how attention.cc schedules its tiles. Work is
// cut into *tasks* (one tile each) that read packed operands shared per
// *segment*; consecutive segments are packed a *batch* at a time (bounded
// scratch); a batch's tasks run in *waves* whose tiles compute in parallel
// and then merge into the accumulators one task after another in a fixed
// order, so results are bitwise the same on any pool (attention.cc's
// banner). Nothing here knows attention: tasks carry indices and costs.
#ifndef HSAP_KERNELS_CPU_TASK_WAVES_H_
#define HSAP_KERNELS_CPU_TASK_WAVES_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"

namespace hsap::kernels::cpu::internal {

// Waves hold (beyond their first task) at most WavePairs(head_dim) allowed
// pairs: 2^21 at head dims of 128 and more, and as many more at smaller ones
// as keeps a wave's arithmetic (pairs x head dim) the same, 2^28. It
// depends on the shape only, so the merge order never depends on the pool;
// a wave takes a few milliseconds, the quantum at which concurrent calls on
// one pool take turns (ThreadPool serves callers first come, first served).
// A wave ends in a barrier whose cost is a wake-up and, on average, half a
// tile of one idle thread: at D = 32 a fixed 2^21 made waves of ~0.6 ms,
// and the 4x larger ones measured +2 to +6 % forward on the 2-core VM
// (kernels/cpu/README.md).
inline constexpr int64_t kWaveWork = int64_t{1} << 28;
inline int64_t WavePairs(int head_dim) {
  return kWaveWork / std::clamp(head_dim, 32, 128);
}

// fn(i) for i < n on `pool` (may be null: in the calling thread).
void RunParallel(ThreadPool* pool, int64_t n, const std::function<void(int64_t)>& fn);

// One tile of work and what it reads.
struct Task {
  int32_t item;
  int32_t head;         // query head (forward) or KV head (backward)
  int64_t block_begin;  // first query row (forward) or key (backward) of the tile
  int64_t cost;         // allowed (q, k) pairs, an upper estimate
  int64_t row_begin = 0, row_end = 0;  // backward: the query rows visited
  int64_t key_begin = 0, key_end = 0;  // forward: the key chunk streamed
  int64_t segment = 0;                 // the packed operands it reads
};

// The operands a set of tasks shares, packed once: forward, the K and V rows
// [begin, end) of an item at one KV head; backward, the Q and dO rows
// [begin, end) of an item at every query head of one KV head.
struct Segment {
  int32_t item = 0;
  int32_t kv_head = 0;
  int64_t begin = std::numeric_limits<int64_t>::max();
  int64_t end = 0;
  int64_t packed = 0;  // offset of its packed rows in the batch's buffer (floats)
  bool used = false;
};

// A run of consecutive segments packed together, and their tasks.
struct Batch {
  size_t task_begin = 0, task_end = 0;
  int64_t segment_begin = 0, segment_end = 0;
};

// Sorts `tasks` by segment, cuts the segment sequence into batches of at
// most `limit` packed rows (rows(segment) each; a batch holds at least one
// segment) and sorts each batch's tasks largest first. Sets each segment's
// `packed` offset within its batch (rows x floats_per_row) and
// *max_batch_floats.
std::vector<Batch> MakeBatches(std::vector<Task>* tasks, std::vector<Segment>* segments,
                               int64_t limit, int64_t floats_per_row,
                               const std::function<int64_t(const Segment&)>& rows,
                               int64_t* max_batch_floats);

// Runs tasks in waves of at most `wave` tasks and `wave_pairs` pairs:
// compute(index, slot) for a wave's tasks in parallel (slot in [0, 2 wave)
// names the task's private buffers), then merge(index, slot) for each of
// them in index order. A wave's merge runs as one more job of the next
// parallel step (the next wave's tiles, or the packing of the next batch),
// so no thread waits for it; merges still happen one wave after another,
// each in index order, on any pool.
class WaveRunner {
 public:
  using Fn = std::function<void(int64_t, int64_t)>;
  WaveRunner(ThreadPool* pool, const std::vector<Task>& tasks, int64_t wave, int64_t wave_pairs,
             Fn compute, Fn merge)
      : pool_(pool), tasks_(tasks), wave_(wave), wave_pairs_(wave_pairs),
        compute_(std::move(compute)), merge_(std::move(merge)) {}

  // job(i) for i < n in parallel, beside the pending merge (which it completes).
  void Parallel(int64_t n, const std::function<void(int64_t)>& job);

  // Runs tasks [begin, end); the last wave's merge stays pending. Before
  // each wave `stop` (may be null) is asked whether to go on; returns false
  // (everything computed merged) when it said stop.
  bool Run(size_t begin, size_t end, const StopFn* stop);

  // Completes the pending merge.
  void Finish() { Parallel(0, [](int64_t) {}); }

 private:
  ThreadPool* pool_;
  const std::vector<Task>& tasks_;
  const int64_t wave_;
  const int64_t wave_pairs_;
  const Fn compute_, merge_;
  int64_t parity_ = 0;
  int64_t pending_first_ = 0, pending_count_ = 0, pending_slot_ = 0;
};

// Packs the segments of one batch: fn(segment, first_row, rows) for pieces
// of at most 256 rows of every used segment in [seg_begin, seg_end), in
// parallel (beside the runner's pending merge).
void PackBatch(WaveRunner* runner, const std::vector<Segment>& segments, int64_t seg_begin,
               int64_t seg_end, const std::function<void(const Segment&, int64_t, int64_t)>& fn);

}  // namespace hsap::kernels::cpu::internal

#endif  // HSAP_KERNELS_CPU_TASK_WAVES_H_

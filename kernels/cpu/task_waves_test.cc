#include "kernels/cpu/task_waves.h"

#include <atomic>
#include <cstdint>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"

namespace hsap::kernels::cpu::internal {
namespace {

TEST(WavePairs, KeepsAWavesArithmeticConstantBetweenHeadDims32And128) {
  EXPECT_EQ(WavePairs(32), int64_t{1} << 23);
  EXPECT_EQ(WavePairs(64), int64_t{1} << 22);
  EXPECT_EQ(WavePairs(128), int64_t{1} << 21);
  EXPECT_EQ(WavePairs(256), int64_t{1} << 21);  // never below 2^21
  EXPECT_EQ(WavePairs(8), int64_t{1} << 23);    // nor above 2^23
  EXPECT_EQ(WavePairs(96), kWaveWork / 96);
}

// Whatever the wave size in tasks and pairs and the pool, every task is
// computed once into a slot that no other task of the two live waves holds,
// and merged from that slot after its compute, in index order: the wave
// size cannot change what the accumulators receive.
TEST(WaveRunner, MergesEveryTaskOnceInIndexOrderWhateverTheWaveSize) {
  std::mt19937_64 rng(7);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t wave : {1, 3, 64}) {
      for (int64_t wave_pairs : {int64_t{1}, int64_t{1000}, int64_t{1} << 21, int64_t{1} << 40}) {
        std::vector<Task> tasks(200);
        for (Task& t : tasks) t.cost = static_cast<int64_t>(rng() % 5000);
        std::vector<std::atomic<int>> computed(tasks.size());
        std::vector<std::atomic<int64_t>> slot_owner(2 * wave);
        for (auto& s : slot_owner) s = -1;
        std::vector<int64_t> merged;
        std::atomic<int> errors{0};
        WaveRunner runner(
            &pool, tasks, wave, wave_pairs,
            [&](int64_t index, int64_t slot) {
              if (slot < 0 || slot >= 2 * wave) {
                ++errors;
                return;
              }
              slot_owner[slot] = index;
              ++computed[index];
            },
            [&](int64_t index, int64_t slot) {
              if (computed[index] != 1 || slot_owner[slot] != index) ++errors;
              merged.push_back(index);
            });
        ASSERT_TRUE(runner.Run(0, 120, nullptr));
        ASSERT_TRUE(runner.Run(120, tasks.size(), nullptr));
        runner.Finish();
        EXPECT_EQ(errors.load(), 0) << threads << " " << wave << " " << wave_pairs;
        ASSERT_EQ(merged.size(), tasks.size()) << threads << " " << wave << " " << wave_pairs;
        for (size_t i = 0; i < merged.size(); ++i) ASSERT_EQ(merged[i], static_cast<int64_t>(i));
      }
    }
  }
}

}  // namespace
}  // namespace hsap::kernels::cpu::internal

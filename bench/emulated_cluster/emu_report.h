// The emulated cluster's report: per pack and summed, each strategy's
// measured and modeled time and busiest-rank bytes, and the figures of the
// closing line (bench/emulated_cluster/README.md):
//
//   speedup_vs_best_baseline=<m> modeled_speedup=<m> auto_vs_measured_best=<r> model_error=<e>
//
// Pure arithmetic over numbers the bench measured and modeled, so that its
// definitions are tested (emu_report_test.cc) apart from any cluster.
#ifndef HSAP_BENCH_EMULATED_CLUSTER_EMU_REPORT_H_
#define HSAP_BENCH_EMULATED_CLUSTER_EMU_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace hsap::bench {

// The median (an even count: the mean of the middle two; empty: 0). The
// bench's repetitions and the report's model error use it.
double Median(std::vector<double> v);

// One strategy on one pack.
struct EmuCell {
  std::string strategy;           // "ring", ..., "auto"
  std::string ran;                // what ran (auto: the daemon's or the bench's choice)
  bool ok = false;                // false: it could not run (error says why)
  std::string error;
  double measured_fwd_s = 0;      // median over the repetitions
  double measured_bwd_s = 0;
  double modeled_s = 0;           // the plan of `ran` under the emulation's profile, fwd + bwd
  double modeled_fwd_s = 0;       // its forward part
  int64_t measured_busiest_bytes = 0;  // forward bytes received by the busiest rank (transport count)
  int64_t modeled_busiest_bytes = 0;   // the plan's max_fwd_recv_bytes
  double measured_s() const { return measured_fwd_s + measured_bwd_s; }
};

struct EmuPack {
  std::vector<EmuCell> cells;  // the same strategies, in the same order, on every pack
};

struct EmuSummary {
  // Best baseline's summed time over the best of hsap's and auto's (> 1:
  // hsap/auto faster). Baselines: ring, allgather, ulysses, usp.
  double speedup_measured = 0;
  double speedup_modeled = 0;
  std::string best_baseline_measured, best_baseline_modeled;
  // auto's summed measured time over the sum, per pack, of the fastest
  // strategy's measured time.
  double auto_vs_measured_best = 0;
  // Median over every (pack, strategy) cell of |modeled - measured| / measured.
  double model_error = 0;
  // Strategies by summed time, fastest first (auto excluded: it is one of them).
  std::vector<std::string> rank_measured, rank_modeled;
  bool same_ranking = false;
  std::vector<double> summed_measured_s, summed_modeled_s;  // per strategy (cells order)
  std::vector<int64_t> summed_measured_bytes, summed_modeled_bytes;
  bool complete = false;  // every cell ran
};

// REQUIRES: packs non-empty, same strategies in the same order on each.
// Cells that did not run are left out of every figure (complete = false).
EmuSummary Summarize(const std::vector<EmuPack>& packs);

// Tables: one pack (title given), and the sums with the rankings.
std::string FormatPackTable(const std::string& title, const EmuPack& pack);
std::string FormatSummary(const std::vector<EmuPack>& packs, const EmuSummary& s);
// The closing line, exactly as the issue gives it (3 decimals).
std::string FinalLine(const EmuSummary& s);

}  // namespace hsap::bench

#endif  // HSAP_BENCH_EMULATED_CLUSTER_EMU_REPORT_H_

// The report's figures from hand-made cells: speedups, auto against the
// per-pack best, the median model error, rankings, and cells that did not run.
#include "bench/emulated_cluster/emu_report.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace hsap::bench {
namespace {

EmuCell Cell(const std::string& s, double measured, double modeled, const std::string& ran = "") {
  EmuCell c;
  c.strategy = s;
  c.ran = ran.empty() ? s : ran;
  c.ok = true;
  c.measured_fwd_s = measured * 0.25;
  c.measured_bwd_s = measured * 0.75;
  c.modeled_s = modeled;
  c.measured_busiest_bytes = static_cast<int64_t>(measured * 1000);
  c.modeled_busiest_bytes = static_cast<int64_t>(modeled * 1000);
  return c;
}

std::vector<EmuPack> Packs() {
  EmuPack a, b;
  // pack a: usp best baseline (10), hsap 5, auto ran sap 4 (the fastest).
  a.cells = {Cell("ring", 20, 22), Cell("usp", 10, 9), Cell("sap", 4, 4.4), Cell("hsap", 5, 5),
             Cell("auto", 4.2, 4.4, "sap")};
  // pack b: ring best baseline (8), hsap 4 (fastest), auto ran sap 6.
  b.cells = {Cell("ring", 8, 8), Cell("usp", 12, 10), Cell("sap", 6, 6), Cell("hsap", 4, 5),
             Cell("auto", 6, 6, "sap")};
  return {a, b};
}

TEST(EmuReportTest, Figures) {
  const EmuSummary s = Summarize(Packs());
  ASSERT_TRUE(s.complete);
  // Sums: ring 28 / 30, usp 22 / 19, sap 10 / 10.4, hsap 9 / 10, auto 10.2 / 10.4.
  EXPECT_DOUBLE_EQ(s.summed_measured_s[1], 22);
  EXPECT_DOUBLE_EQ(s.summed_modeled_s[3], 10);
  EXPECT_EQ(s.best_baseline_measured, "usp");
  EXPECT_EQ(s.best_baseline_modeled, "usp");
  EXPECT_DOUBLE_EQ(s.speedup_measured, 22.0 / 9.0);    // best of hsap (9) and auto (10.2)
  EXPECT_DOUBLE_EQ(s.speedup_modeled, 19.0 / 10.0);    // hsap 10 vs auto 10.4
  EXPECT_DOUBLE_EQ(s.auto_vs_measured_best, 10.2 / (4 + 4));  // per-pack best: sap 4, hsap 4
  // Errors: a: .1 .1 .1 0 .2/4.2; b: 0 1/6 0 .25 0 -> median of ten = (.2/4.2 + .1) / 2.
  EXPECT_NEAR(s.model_error, (0.2 / 4.2 + 0.1) / 2, 1e-12);
  EXPECT_EQ(s.rank_measured, (std::vector<std::string>{"hsap", "sap", "usp", "ring"}));
  EXPECT_EQ(s.rank_modeled, (std::vector<std::string>{"hsap", "sap", "usp", "ring"}));
  EXPECT_TRUE(s.same_ranking);
  EXPECT_EQ(s.summed_measured_bytes[0], 28000);
  EXPECT_EQ(FinalLine(s),
            "speedup_vs_best_baseline=2.444 modeled_speedup=1.900 auto_vs_measured_best=1.275 "
            "model_error=0.074");
  const std::string table = FormatSummary(Packs(), s);
  EXPECT_NE(table.find("ranked by measured time: hsap < sap < usp < ring"), std::string::npos)
      << table;
  EXPECT_NE(FormatPackTable("pack 0", Packs()[0]).find("auto      sap"), std::string::npos);
}

TEST(EmuReportTest, RankingsDifferAndCellsThatDidNotRun) {
  std::vector<EmuPack> packs = Packs();
  packs[0].cells[0].modeled_s = 1;  // ring modeled fastest overall
  packs[1].cells[1].ok = false;     // usp did not run on pack b
  packs[1].cells[1].error = "time limit";
  const EmuSummary s = Summarize(packs);
  EXPECT_FALSE(s.complete);
  EXPECT_FALSE(s.same_ranking);
  EXPECT_EQ(s.rank_modeled.front(), "ring");
  // usp is left out of every comparison: ring is the only baseline.
  EXPECT_EQ(s.best_baseline_measured, "ring");
  EXPECT_DOUBLE_EQ(s.speedup_measured, 28.0 / 9.0);
  EXPECT_EQ(std::count(s.rank_measured.begin(), s.rank_measured.end(), "usp"), 0);
  EXPECT_NE(FormatPackTable("pack 1", packs[1]).find("usp       cannot run: time limit"),
            std::string::npos);
}

TEST(EmuReportTest, MedianOfAnEvenCountIsTheMeanOfTheMiddleTwo) {
  // Two repetitions: not the larger one (the bench's own median took it,
  // so one stalled repetition set a strategy's time).
  EXPECT_DOUBLE_EQ(Median({172.3, 386.4}), 279.35);
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({}), 0);
}

}  // namespace
}  // namespace hsap::bench

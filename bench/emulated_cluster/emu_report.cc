#include "bench/emulated_cluster/emu_report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace hsap::bench {
namespace {

bool IsBaseline(const std::string& s) {
  return s == "ring" || s == "allgather" || s == "ulysses" || s == "usp";
}

// Strategy names ordered by `t` (ascending), auto left out; ties keep cell order.
std::vector<std::string> Ranking(const std::vector<EmuCell>& cells, const std::vector<double>& t) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (cells[i].strategy != "auto") idx.push_back(i);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return t[a] < t[b]; });
  std::vector<std::string> out;
  for (size_t i : idx) out.push_back(cells[i].strategy);
  return out;
}

}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

EmuSummary Summarize(const std::vector<EmuPack>& packs) {
  EmuSummary s;
  const std::vector<EmuCell>& first = packs.front().cells;
  const size_t n = first.size();
  s.summed_measured_s.assign(n, 0);
  s.summed_modeled_s.assign(n, 0);
  s.summed_measured_bytes.assign(n, 0);
  s.summed_modeled_bytes.assign(n, 0);
  s.complete = true;
  std::vector<double> errors;
  double best_per_pack_sum = 0;
  std::vector<bool> usable(n, true);
  for (const EmuPack& p : packs) {
    for (size_t i = 0; i < n; ++i) usable[i] = usable[i] && p.cells[i].ok;
  }
  for (const EmuPack& p : packs) {
    double best = 0;
    for (size_t i = 0; i < n; ++i) {
      const EmuCell& c = p.cells[i];
      if (!c.ok) {
        s.complete = false;
        continue;
      }
      s.summed_measured_s[i] += c.measured_s();
      s.summed_modeled_s[i] += c.modeled_s;
      s.summed_measured_bytes[i] += c.measured_busiest_bytes;
      s.summed_modeled_bytes[i] += c.modeled_busiest_bytes;
      if (c.measured_s() > 0) errors.push_back(std::fabs(c.modeled_s - c.measured_s()) / c.measured_s());
      if (best == 0 || c.measured_s() < best) best = c.measured_s();
    }
    best_per_pack_sum += best;
  }
  s.model_error = Median(errors);
  double base_m = 0, base_p = 0, ours_m = 0, ours_p = 0, auto_m = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!usable[i]) continue;
    const std::string& name = first[i].strategy;
    if (IsBaseline(name)) {
      if (base_m == 0 || s.summed_measured_s[i] < base_m) {
        base_m = s.summed_measured_s[i];
        s.best_baseline_measured = name;
      }
      if (base_p == 0 || s.summed_modeled_s[i] < base_p) {
        base_p = s.summed_modeled_s[i];
        s.best_baseline_modeled = name;
      }
    }
    if (name == "hsap" || name == "auto") {
      if (ours_m == 0 || s.summed_measured_s[i] < ours_m) ours_m = s.summed_measured_s[i];
      if (ours_p == 0 || s.summed_modeled_s[i] < ours_p) ours_p = s.summed_modeled_s[i];
    }
    if (name == "auto") auto_m = s.summed_measured_s[i];
  }
  s.speedup_measured = ours_m > 0 ? base_m / ours_m : 0;
  s.speedup_modeled = ours_p > 0 ? base_p / ours_p : 0;
  s.auto_vs_measured_best = best_per_pack_sum > 0 ? auto_m / best_per_pack_sum : 0;
  std::vector<EmuCell> usable_cells;
  std::vector<double> tm, tp;
  for (size_t i = 0; i < n; ++i) {
    if (!usable[i]) continue;
    usable_cells.push_back(first[i]);
    tm.push_back(s.summed_measured_s[i]);
    tp.push_back(s.summed_modeled_s[i]);
  }
  s.rank_measured = Ranking(usable_cells, tm);
  s.rank_modeled = Ranking(usable_cells, tp);
  s.same_ranking = s.rank_measured == s.rank_modeled;
  return s;
}

std::string FormatPackTable(const std::string& title, const EmuPack& pack) {
  double best_base_m = 0, best_base_p = 0;
  for (const EmuCell& c : pack.cells) {
    if (!c.ok || !IsBaseline(c.strategy)) continue;
    if (best_base_m == 0 || c.measured_s() < best_base_m) best_base_m = c.measured_s();
    if (best_base_p == 0 || c.modeled_s < best_base_p) best_base_p = c.modeled_s;
  }
  std::string out = absl::StrFormat(
      "%s\n  %-9s %-9s %9s %9s %10s %9s %10s %8s %8s %8s %13s %13s\n", title, "strategy",
      "ran", "fwd ms", "bwd ms", "measured", "mod fwd", "modeled", "mod/meas", "meas/bb",
      "mod/bb", "busiest B", "modeled B");
  for (const EmuCell& c : pack.cells) {
    if (!c.ok) {
      absl::StrAppendFormat(&out, "  %-9s cannot run: %s\n", c.strategy, c.error.substr(0, 120));
      continue;
    }
    absl::StrAppendFormat(
        &out, "  %-9s %-9s %9.1f %9.1f %10.1f %9.1f %10.1f %8.3f %8.3f %8.3f %13d %13d\n",
        c.strategy, c.ran, c.measured_fwd_s * 1e3, c.measured_bwd_s * 1e3, c.measured_s() * 1e3,
        c.modeled_fwd_s * 1e3, c.modeled_s * 1e3, c.measured_s() > 0 ? c.modeled_s / c.measured_s() : 0.0,
        best_base_m > 0 ? c.measured_s() / best_base_m : 0.0,
        best_base_p > 0 ? c.modeled_s / best_base_p : 0.0, c.measured_busiest_bytes,
        c.modeled_busiest_bytes);
  }
  return out;
}

std::string FormatSummary(const std::vector<EmuPack>& packs, const EmuSummary& s) {
  const std::vector<EmuCell>& first = packs.front().cells;
  std::string out = absl::StrFormat(
      "summed over %d pack(s)%s (bb: best baseline)\n  %-9s %10s %10s %8s %8s %8s %14s %14s\n",
      packs.size(), s.complete ? "" : ", cells that did not run left out", "strategy",
      "measured", "modeled", "mod/meas", "meas/bb", "mod/bb", "busiest B", "modeled B");
  double bb_m = 0, bb_p = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i].strategy == s.best_baseline_measured) bb_m = s.summed_measured_s[i];
    if (first[i].strategy == s.best_baseline_modeled) bb_p = s.summed_modeled_s[i];
  }
  for (size_t i = 0; i < first.size(); ++i) {
    const double m = s.summed_measured_s[i], p = s.summed_modeled_s[i];
    absl::StrAppendFormat(&out, "  %-9s %10.1f %10.1f %8.3f %8.3f %8.3f %14d %14d\n",
                          first[i].strategy, m * 1e3, p * 1e3, m > 0 ? p / m : 0.0,
                          bb_m > 0 ? m / bb_m : 0.0, bb_p > 0 ? p / bb_p : 0.0,
                          s.summed_measured_bytes[i], s.summed_modeled_bytes[i]);
  }
  absl::StrAppendFormat(&out, "  ranked by measured time: %s\n", absl::StrJoin(s.rank_measured, " < "));
  absl::StrAppendFormat(&out, "  ranked by modeled time:  %s\n", absl::StrJoin(s.rank_modeled, " < "));
  absl::StrAppendFormat(&out, "  same ranking: %s; best baseline measured %s, modeled %s\n",
                        s.same_ranking ? "yes" : "no", s.best_baseline_measured,
                        s.best_baseline_modeled);
  return out;
}

std::string FinalLine(const EmuSummary& s) {
  return absl::StrFormat(
      "speedup_vs_best_baseline=%.3f modeled_speedup=%.3f auto_vs_measured_best=%.3f "
      "model_error=%.3f",
      s.speedup_measured, s.speedup_modeled, s.auto_vs_measured_best, s.model_error);
}

}  // namespace hsap::bench

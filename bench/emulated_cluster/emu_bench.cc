// emu_bench: the client side of the emulated cluster (run.sh sets up the
// namespaces, links and daemons and calls this twice).
//
//   --phase=wait       every daemon sees the cluster formed.
//   --phase=calibrate  the effective FLOP/s of one rank with every rank of
//                      the machine busy (Calibrate below). Last line:
//                      flops_per_rank=<x>
//   --phase=link_rate  the per-rank inter-node bytes/s that gives that rank
//                      --target_profile's FLOP per byte. Last line:
//                      inter_bytes_per_s=<x>
//   --phase=measure    every strategy side by side on packs of the workload,
//                      forward + backward, median of --reps, next to the
//                      plan modeled under --profile (the emulation's
//                      measured figures); tables and the closing line
//                      (emu_report.h).
//   --phase=model      no cluster: the modeled ms of every strategy on
//                      --nodes x --devices under --profile, ranked.
//
// Clients run in the root network namespace: sessions and calls go over
// the daemons' Unix sockets (a filesystem path reaches a daemon in any
// network namespace); only daemon-to-daemon traffic crosses the links.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/emulated_cluster/emu_report.h"
#include "common/workload.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "server/plan/compiler.h"
#include "server/plan/cost_model.h"
#include "tests/integration/group_call.h"

ABSL_FLAG(std::string, phase, "measure", "wait, calibrate, link_rate, measure or model");
ABSL_FLAG(int, nodes, 0, "model: nodes of the modeled cluster (the other phases: one per socket)");
ABSL_FLAG(double, flops_per_rank, 0, "link_rate: the calibrated FLOP/s of one rank");
ABSL_FLAG(std::string, target_profile, "h100",
          "link_rate: the profile whose FLOP/s over inter-node bytes/s the links reproduce");
ABSL_FLAG(int, wait_s, 60, "wait: seconds for every daemon to see the cluster formed");
ABSL_FLAG(std::string, sockets, "", "the daemons' gRPC Unix sockets, in node order, commas");
ABSL_FLAG(int, devices, 2, "CPU device slots per node");
ABSL_FLAG(int64_t, tokens, 262144, "tokens per pack T");
ABSL_FLAG(int, packs, 2, "packs of the workload");
ABSL_FLAG(int, reps, 3, "repetitions per (pack, strategy); the median is reported");
ABSL_FLAG(int, heads, 8, "query heads");
ABSL_FLAG(int, kv_heads, 2, "key/value heads");
ABSL_FLAG(int, head_dim, 32, "head dimension (fp32)");
ABSL_FLAG(std::string, strategies, "ring,allgather,ulysses,usp,sap,hsap,auto", "strategies");
ABSL_FLAG(std::string, profile, "",
          "measure: the emulation's cost profile (custom:...) the modeled times use");
ABSL_FLAG(std::string, auto_by, "daemon",
          "who resolves auto: daemon (hsapd plans it with its own --profile) or bench (the "
          "bench compiles auto under --profile and asks the daemons for that strategy: for "
          "daemons without a --profile flag)");
ABSL_FLAG(int, calibrate_reps, 3, "calibrate: repetitions per strategy (the median is used)");
ABSL_FLAG(int, time_limit_s, 3600, "measure: no new run starts after this many seconds");
ABSL_FLAG(int, deadline_ms, 1200000, "per-call deadline");

namespace {

using hsap::bench::EmuCell;
using hsap::bench::EmuPack;
using hsap::bench::Median;
using hsap::plan::Strategy;
using hsap::testing::GroupSpec;

hsap::plan::PlanSpec ModelSpec(const std::vector<int64_t>& cu, int nodes, int devices,
                               Strategy s, const std::string& profile) {
  hsap::plan::PlanSpec spec;
  spec.cu_seqlens = cu;
  spec.total_tokens = cu.back();
  spec.topology = {nodes, devices};
  spec.shape = {absl::GetFlag(FLAGS_heads), absl::GetFlag(FLAGS_kv_heads),
                absl::GetFlag(FLAGS_head_dim), hsap::DType::kFloat32};
  spec.strategy = s;
  spec.assignment = hsap::plan::AssignmentPolicy::kBalanced;
  spec.profile = profile;
  return spec;
}

std::string NextGroup(const char* what) {
  static int counter = 0;
  return absl::StrCat("emu-", what, "-", getpid(), "-", counter++);
}

// The calibration: the bench's first pack on the whole cluster with the
// links not yet shaped (transfers then cost little next to compute), once
// with sap (every head on every rank, as ring and allgather) and once with
// hsap (heads split over a node's slots, as ulysses and usp). A run's
// work is its plan modeled at 1 FLOP/s over free links (the busiest rank
// of every stage, forward + backward); its rate is that over its measured
// time. The rank's rate is the mean of the two strategies' medians.
int Calibrate(const std::vector<std::string>& sockets, const std::vector<int64_t>& lengths) {
  const int nodes = static_cast<int>(sockets.size()), devices = absl::GetFlag(FLAGS_devices);
  const std::vector<int64_t> cu =
      hsap::PackDocuments(lengths, absl::GetFlag(FLAGS_tokens), 1, /*seed=*/2026)[0];
  const auto problem = hsap::testing::MakeProblem(cu, true, 0, false, absl::GetFlag(FLAGS_heads),
                                                  absl::GetFlag(FLAGS_kv_heads),
                                                  absl::GetFlag(FLAGS_head_dim));
  std::printf("calibration: pack 0 (%zu documents) on all %d x %d ranks, links unshaped, "
              "median of %d\n",
              cu.size() - 1, nodes, devices, absl::GetFlag(FLAGS_calibrate_reps));
  double sum_rates = 0;
  const std::pair<Strategy, hsap::v1::Strategy> kinds[] = {
      {Strategy::kSap, hsap::v1::STRATEGY_SAP}, {Strategy::kHsap, hsap::v1::STRATEGY_HSAP}};
  for (const auto& [s, wire] : kinds) {
    auto plan = hsap::plan::CompilePlan(ModelSpec(
        cu, nodes, devices, s, "custom:flops=1,inter_bytes_per_s=1e15,intra_bytes_per_s=1e15"));
    if (!plan.ok()) {
      std::fprintf(stderr, "emu_bench: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    const double flops = plan->stats.modeled_us * 1e-6;
    std::vector<double> rates;
    std::printf("  %-4s work %.4g FLOP:", std::string(hsap::plan::StrategyName(s)).c_str(), flops);
    for (int rep = 0; rep < absl::GetFlag(FLAGS_calibrate_reps); ++rep) {
      GroupSpec spec;
      spec.group = NextGroup("cal");
      spec.nodes = nodes;
      spec.devices_per_node = devices;
      spec.sockets = sockets;
      spec.strategy = wire;
      spec.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
      auto r = hsap::testing::RunGroup(problem, spec);
      if (!r.ok()) {
        std::fprintf(stderr, "emu_bench: calibration: %s\n", r.status().ToString().c_str());
        return 1;
      }
      const double t = r->forward_seconds + r->backward_seconds;
      rates.push_back(flops / t);
      std::printf(" %.2f s (%.4g FLOP/s)", t, flops / t);
      std::fflush(stdout);
    }
    std::printf(" -> median %.4g FLOP/s\n", Median(rates));
    sum_rates += Median(rates);
  }
  std::printf("flops_per_rank=%.6g\n", sum_rates / 2);
  return 0;
}

struct Runs {
  std::vector<double> fwd, bwd;
  int64_t busiest = 0;
  std::string ran, error;
};

int Measure(const std::vector<std::string>& sockets, const std::vector<int64_t>& lengths) {
  const int nodes = static_cast<int>(sockets.size()), devices = absl::GetFlag(FLAGS_devices);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  if (!hsap::plan::IsKnownProfile(profile)) {
    std::fprintf(stderr, "emu_bench: --profile: %s\n",
                 hsap::plan::ParseHardwareProfile(profile).status().ToString().c_str());
    return 2;
  }
  const bool auto_by_bench = absl::GetFlag(FLAGS_auto_by) == "bench";
  std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',', absl::SkipEmpty());
  std::vector<Strategy> strategies;
  for (const std::string& n : names) {
    Strategy s;
    if (!hsap::plan::ParseStrategy(n, &s)) {
      std::fprintf(stderr, "emu_bench: unknown strategy %s\n", n.c_str());
      return 2;
    }
    strategies.push_back(s);
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto packs = hsap::PackDocuments(lengths, absl::GetFlag(FLAGS_tokens),
                                         absl::GetFlag(FLAGS_packs), /*seed=*/2026);
  std::printf("measure: %d nodes x %d slots, T=%lld, Hq=%d Hkv=%d D=%d fp32, %zu packs, median "
              "of %d, auto resolved by the %s\n  model profile %s\n",
              nodes, devices, static_cast<long long>(absl::GetFlag(FLAGS_tokens)),
              absl::GetFlag(FLAGS_heads), absl::GetFlag(FLAGS_kv_heads),
              absl::GetFlag(FLAGS_head_dim), packs.size(), absl::GetFlag(FLAGS_reps),
              auto_by_bench ? "bench (under the model profile)" : "daemon", profile.c_str());
  std::vector<EmuPack> results;
  for (size_t pi = 0; pi < packs.size(); ++pi) {
    const auto& cu = packs[pi];
    // The model of every strategy under the emulation's profile.
    std::vector<hsap::plan::Plan> model;
    for (Strategy s : strategies) {
      auto p = hsap::plan::CompilePlan(ModelSpec(cu, nodes, devices, s, profile));
      if (!p.ok()) {
        std::fprintf(stderr, "emu_bench: model of %s: %s\n",
                     std::string(hsap::plan::StrategyName(s)).c_str(), p.status().ToString().c_str());
        return 1;
      }
      model.push_back(std::move(p).value());
    }
    const auto problem = hsap::testing::MakeProblem(cu, true, pi, false, absl::GetFlag(FLAGS_heads),
                                                    absl::GetFlag(FLAGS_kv_heads),
                                                    absl::GetFlag(FLAGS_head_dim));
    std::vector<Runs> runs(strategies.size());
    // Repetitions outermost: each strategy's runs spread over the pack's
    // time, so that load from elsewhere falls on all of them alike.
    for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
      for (size_t i = 0; i < strategies.size(); ++i) {
        Runs& r = runs[i];
        if (!r.error.empty()) continue;
        if (elapsed_s() > absl::GetFlag(FLAGS_time_limit_s)) {
          if (r.fwd.empty()) r.error = "time limit reached before it ran";
          continue;
        }
        Strategy s = strategies[i];
        if (s == Strategy::kAuto && auto_by_bench) s = model[i].strategy;
        GroupSpec spec;
        spec.group = NextGroup("run");
        spec.nodes = nodes;
        spec.devices_per_node = devices;
        spec.sockets = sockets;
        spec.strategy = static_cast<hsap::v1::Strategy>(s);
        spec.assignment = hsap::v1::ASSIGNMENT_BALANCED;
        spec.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
        auto g = hsap::testing::RunGroup(problem, spec);
        if (!g.ok()) {
          r.error = std::string(g.status().ToString());
          continue;
        }
        r.fwd.push_back(g->forward_seconds);
        r.bwd.push_back(g->backward_seconds);
        r.busiest = static_cast<int64_t>(
            *std::max_element(g->bytes_received.begin(), g->bytes_received.end()));
        r.ran = hsap::v1::Strategy_Name(g->strategies_run[0]).substr(9);
        std::transform(r.ran.begin(), r.ran.end(), r.ran.begin(), ::tolower);
        std::printf("    pack %zu rep %d %-9s %9.1f ms (%.0f s elapsed)\n", pi, rep, names[i].c_str(),
                    (g->forward_seconds + g->backward_seconds) * 1e3, elapsed_s());
        std::fflush(stdout);
      }
    }
    EmuPack pack;
    for (size_t i = 0; i < strategies.size(); ++i) {
      EmuCell c;
      c.strategy = names[i];
      c.ok = !runs[i].fwd.empty();
      c.error = runs[i].error;
      c.ran = runs[i].ran;
      c.measured_fwd_s = Median(runs[i].fwd);
      c.measured_bwd_s = Median(runs[i].bwd);
      c.measured_busiest_bytes = runs[i].busiest;
      // The model of what ran (auto: the plan of the strategy it ran).
      const hsap::plan::Plan* m = &model[i];
      for (size_t j = 0; j < strategies.size(); ++j) {
        if (hsap::plan::StrategyName(strategies[j]) == c.ran) m = &model[j];
      }
      c.modeled_s = m->stats.modeled_us * 1e-6;
      c.modeled_fwd_s = m->stats.fwd_us * 1e-6;
      c.modeled_busiest_bytes = m->stats.max_fwd_recv_bytes;
      pack.cells.push_back(c);
    }
    std::printf("%s", hsap::bench::FormatPackTable(
                          absl::StrCat("pack ", pi, ": ", cu.size() - 1, " documents; model's auto "
                                       "picks ", hsap::plan::StrategyName(model.back().strategy)),
                          pack)
                          .c_str());
    std::fflush(stdout);
    results.push_back(std::move(pack));
  }
  const auto summary = hsap::bench::Summarize(results);
  std::printf("%s", hsap::bench::FormatSummary(results, summary).c_str());
  std::printf("%s\n", hsap::bench::FinalLine(summary).c_str());
  return 0;
}

}  // namespace

// Every daemon answers and sees the cluster formed.
int Wait(const std::vector<std::string>& sockets) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_wait_s));
  for (size_t i = 0; i < sockets.size(); ++i) {
    auto stub = hsap::v1::Cluster::NewStub(
        grpc::CreateChannel("unix:" + sockets[i], grpc::InsecureChannelCredentials()));
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      hsap::v1::GetClusterStatusResponse resp;
      if (stub->GetClusterStatus(&ctx, {}, &resp).ok() && resp.formed()) break;
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "emu_bench: node %zu (%s) did not see the cluster formed in %d s\n", i,
                     sockets[i].c_str(), absl::GetFlag(FLAGS_wait_s));
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  std::printf("cluster formed: %zu nodes\n", sockets.size());
  return 0;
}

// The per-rank inter-node bandwidth that gives the calibrated rank the
// target profile's compute-to-bandwidth ratio.
int LinkRate() {
  auto target = hsap::plan::ParseHardwareProfile(absl::GetFlag(FLAGS_target_profile));
  const double flops = absl::GetFlag(FLAGS_flops_per_rank);
  if (!target.ok() || !(flops > 0)) {
    std::fprintf(stderr, "emu_bench: link_rate needs --flops_per_rank > 0 and a known "
                         "--target_profile\n");
    return 2;
  }
  const double ratio = target->attention_flops / target->inter_bytes_per_s;
  std::printf("target %s: %.4g FLOP/s over %.4g B/s per rank = %.1f FLOP per inter-node byte\n",
              target->name.c_str(), target->attention_flops, target->inter_bytes_per_s, ratio);
  std::printf("inter_bytes_per_s=%.6g\n", flops / ratio);
  return 0;
}

// --phase=model: the measure phase's modeled column alone, no cluster: each
// strategy's modeled ms per pack and summed under --profile, ranked.
int Model(const std::vector<int64_t>& lengths) {
  const int nodes = absl::GetFlag(FLAGS_nodes), devices = absl::GetFlag(FLAGS_devices);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  if (nodes < 1 || devices < 1 || !hsap::plan::IsKnownProfile(profile)) {
    std::fprintf(stderr, "emu_bench: model needs --nodes >= 1, --devices >= 1 and a known "
                         "--profile\n");
    return 2;
  }
  const auto packs = hsap::PackDocuments(lengths, absl::GetFlag(FLAGS_tokens),
                                         absl::GetFlag(FLAGS_packs), /*seed=*/2026);
  std::vector<std::pair<double, std::string>> summed;
  if (getenv("DUMPCU")) { for (size_t i = 0; i < packs[0].size(); ++i) std::fprintf(stderr, "%s%ld", i ? "," : "", (long)packs[0][i]); std::fprintf(stderr, "\n"); }
  const std::vector<std::string> names =
      absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',', absl::SkipEmpty());
  for (const std::string& n : names) {
    Strategy s;
    if (!hsap::plan::ParseStrategy(n, &s)) {
      std::fprintf(stderr, "emu_bench: unknown strategy %s\n", n.c_str());
      return 2;
    }
    double total_ms = 0;
    std::printf("  %-9s", n.c_str());
    for (const auto& cu : packs) {
      auto p = hsap::plan::CompilePlan(ModelSpec(cu, nodes, devices, s, profile));
      if (!p.ok()) {
        std::fprintf(stderr, "emu_bench: model of %s: %s\n", n.c_str(), p.status().ToString().c_str());
        return 1;
      }
      std::printf(" %12.1f", p->stats.modeled_us * 1e-3);
      total_ms += p->stats.modeled_us * 1e-3;
    }
    std::printf("  summed %12.1f ms\n", total_ms);
    if (s != Strategy::kAuto) summed.emplace_back(total_ms, n);
  }
  std::sort(summed.begin(), summed.end());
  std::printf("  ranked by modeled time:");
  for (size_t i = 0; i < summed.size(); ++i) {
    std::printf("%s%s", i == 0 ? " " : " < ", summed[i].second.c_str());
  }
  std::printf("\n");
  return 0;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_phase) == "link_rate") return LinkRate();
  if (absl::GetFlag(FLAGS_phase) == "model") {
    auto lengths = hsap::LoadDocumentLengths(hsap::FindWorkload());
    if (!lengths.ok()) {
      std::fprintf(stderr, "emu_bench: %s\n", lengths.status().ToString().c_str());
      return 1;
    }
    return Model(*lengths);
  }
  const std::vector<std::string> sockets =
      absl::StrSplit(absl::GetFlag(FLAGS_sockets), ',', absl::SkipEmpty());
  if (sockets.empty()) {
    std::fprintf(stderr, "emu_bench: --sockets is empty\n");
    return 2;
  }
  const std::string phase = absl::GetFlag(FLAGS_phase);
  if (phase == "wait") return Wait(sockets);
  auto lengths = hsap::LoadDocumentLengths(hsap::FindWorkload());
  if (!lengths.ok()) {
    std::fprintf(stderr, "emu_bench: %s\n", lengths.status().ToString().c_str());
    return 1;
  }
  if (phase == "calibrate") return Calibrate(sockets, *lengths);
  if (phase == "measure") return Measure(sockets, *lengths);
  std::fprintf(stderr, "emu_bench: --phase=%s is not wait, calibrate, link_rate, measure or model\n", phase.c_str());
  return 2;
}

// cluster_bench: forward + backward through a loopback cluster of real
// hsapd processes (UCX over tcp between nodes), for the sequence-aware
// strategies against the baselines, on packs of real document lengths.
//
// Everything is measured side by side in one run: for each pack, --reps
// rounds that each run every strategy once, and per strategy the median
// over rounds of the group's forward and backward wall time (first request
// to last reply), and the bytes each rank received
// (the transports' own counts). Ratios are against ring on the same pack;
// auto against the pack's fastest strategy is the median over rounds of
// the two's ratio within a round (a slow spell of the machine falls on both).
//
//   bazel run -c opt //bench:cluster_bench -- --nodes=2 --devices=2 --tokens=8192
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/workload.h"
#include "server/plan/compiler.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"

ABSL_FLAG(int, nodes, 2, "daemons (nodes) of the loopback cluster");
ABSL_FLAG(int, devices, 2, "CPU device slots per node");
ABSL_FLAG(int64_t, tokens, 8192, "tokens per pack");
ABSL_FLAG(int, packs, 3, "packs of the workload to run");
ABSL_FLAG(int, reps, 5,
          "rounds per pack, each running every strategy once; the median is reported");
ABSL_FLAG(int, heads, 8, "query heads");
ABSL_FLAG(int, kv_heads, 8, "key/value heads");
ABSL_FLAG(int, head_dim, 64, "head dimension");
ABSL_FLAG(std::string, workload, "", "document lengths (default workloads/python-stdlib.tokens of the repository)");
ABSL_FLAG(std::string, ucx_transports, "tcp", "UCX transports between the daemons");
ABSL_FLAG(std::string, model_only, "",
          "a cost profile: print every strategy's modeled time on the packs under it and exit "
          "(no cluster); without it, the modeled column uses the profile node 0 settled");

namespace {

using hsap::testing::GroupResult;
using hsap::testing::GroupSpec;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The model's forward + backward time (ms) of `strategy` on `cu` under
// `profile`, and the strategy auto picks there (for STRATEGY_AUTO); 0 when it
// does not compile.
std::pair<double, std::string> Modeled(const std::vector<int64_t>& cu, int nodes, int devices,
                                       const std::string& strategy, const std::string& profile) {
  hsap::plan::PlanSpec spec;
  spec.cu_seqlens = cu;
  spec.total_tokens = cu.back();
  spec.topology = {nodes, devices};
  spec.shape = {absl::GetFlag(FLAGS_heads), absl::GetFlag(FLAGS_kv_heads),
                absl::GetFlag(FLAGS_head_dim), hsap::DType::kFloat32};
  if (!hsap::plan::ParseStrategy(strategy, &spec.strategy)) return {0, ""};
  spec.assignment = hsap::plan::AssignmentPolicy::kBalanced;
  spec.profile = profile;
  auto plan = hsap::plan::CompilePlan(spec);
  if (!plan.ok()) return {0, ""};
  return {plan->stats.modeled_us * 1e-3, std::string(hsap::plan::StrategyName(plan->strategy))};
}

struct Row {
  double fwd = 0, bwd = 0;
  uint64_t max_recv = 0, total_recv = 0;
  std::string ran;
  bool ok = false;
  std::string error;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int nodes = absl::GetFlag(FLAGS_nodes), devices = absl::GetFlag(FLAGS_devices);
  std::string path = absl::GetFlag(FLAGS_workload);
  if (path.empty()) path = hsap::FindWorkload();
  auto lengths = hsap::LoadDocumentLengths(path);
  if (!lengths.ok()) {
    std::fprintf(stderr, "%s\n", lengths.status().ToString().c_str());
    return 1;
  }
  const std::vector<std::string> names = {"ring", "ulysses", "allgather", "usp", "sap", "hsap", "auto"};
  if (const std::string profile = absl::GetFlag(FLAGS_model_only); !profile.empty()) {
    const auto packs = hsap::PackDocuments(*lengths, absl::GetFlag(FLAGS_tokens),
                                           absl::GetFlag(FLAGS_packs), /*seed=*/2026);
    std::printf("modeled fwd+bwd ms under %s\n", profile.c_str());
    for (size_t pi = 0; pi < packs.size(); ++pi) {
      std::printf("pack %zu:", pi);
      for (const std::string& n : names) {
        const auto [ms, ran] = Modeled(packs[pi], nodes, devices, n, profile);
        std::printf(" %s %.1f%s", n.c_str(), ms, n == "auto" ? (" (" + ran + ")").c_str() : "");
      }
      std::printf("\n");
    }
    return 0;
  }
  auto cluster = hsap::testing::LocalCluster::Start(
      nodes, devices,
      {"--cpu_threads=1", absl::StrCat("--ucx_transports=", absl::GetFlag(FLAGS_ucx_transports)),
       "--call_deadline_ms=600000"});
  if (!cluster.ok() || !(*cluster)->WaitFormed(absl::Seconds(60)).ok()) {
    std::fprintf(stderr, "cluster did not form\n");
    return 1;
  }
  const auto packs = hsap::PackDocuments(*lengths, absl::GetFlag(FLAGS_tokens),
                                         absl::GetFlag(FLAGS_packs), /*seed=*/2026);
  const std::vector<std::pair<const char*, hsap::v1::Strategy>> strategies = {
      {"ring", hsap::v1::STRATEGY_RING},       {"ulysses", hsap::v1::STRATEGY_ULYSSES},
      {"allgather", hsap::v1::STRATEGY_ALLGATHER}, {"usp", hsap::v1::STRATEGY_USP},
      {"sap", hsap::v1::STRATEGY_SAP},         {"hsap", hsap::v1::STRATEGY_HSAP},
      {"auto", hsap::v1::STRATEGY_AUTO}};
  std::printf("HSAP cluster_bench: %d nodes x %d CPU devices (loopback, UCX %s), T=%lld per pack, "
              "Hq=%d Hkv=%d D=%d fp32, causal documents from %s, median of %d\n",
              nodes, devices, absl::GetFlag(FLAGS_ucx_transports).c_str(),
              static_cast<long long>(absl::GetFlag(FLAGS_tokens)), absl::GetFlag(FLAGS_heads),
              absl::GetFlag(FLAGS_kv_heads), absl::GetFlag(FLAGS_head_dim), path.c_str(),
              absl::GetFlag(FLAGS_reps));
  std::map<std::string, double> sum_time, sum_max_recv;
  double worst_auto = 0;  // auto over the fastest strategy, worst pack
  uint64_t seq_group = 0;
  for (size_t pi = 0; pi < packs.size(); ++pi) {
    const auto& cu = packs[pi];
    const auto problem = hsap::testing::MakeProblem(
        cu, true, pi, /*with_reference=*/false, absl::GetFlag(FLAGS_heads),
        absl::GetFlag(FLAGS_kv_heads), absl::GetFlag(FLAGS_head_dim));
    std::printf("\npack %zu: %zu documents (longest %lld tokens)\n", pi, cu.size() - 1,
                [&] {
                  long long m = 0;
                  for (size_t i = 1; i < cu.size(); ++i) m = std::max<long long>(m, cu[i] - cu[i - 1]);
                  return m;
                }());
    std::printf("  %-9s %-8s %10s %10s %10s %10s %9s %14s %14s\n", "strategy", "ran", "fwd ms",
                "bwd ms", "fwd+bwd", "modeled", "vs ring", "max recv B/rk", "total recv B");
    // Repetition-major: every strategy once per round, so that a slow spell
    // of this shared machine falls on all of them, not on one strategy's
    // repetitions; the median over rounds counts. Each round starts one
    // strategy later, so no strategy always runs in the same place (auto
    // always after hsap, the same plan as ulysses, read 1.094x ulysses on
    // one pack at 9 rounds).
    std::map<std::string, Row> rows;
    std::map<std::string, std::vector<double>> fwd, bwd;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
      for (size_t k = 0; k < strategies.size(); ++k) {
        const auto& [name, strategy] = strategies[(k + rep) % strategies.size()];
        Row& row = rows[name];
        if (!row.error.empty()) continue;
        GroupSpec spec;
        spec.group = absl::StrCat("bench", seq_group++);
        spec.nodes = nodes;
        spec.devices_per_node = devices;
        spec.sockets = (*cluster)->sockets();
        spec.strategy = strategy;
        spec.assignment = hsap::v1::ASSIGNMENT_BALANCED;
        auto r = hsap::testing::RunGroup(problem, spec);
        if (!r.ok()) {
          row.error = std::string(r.status().message());
          row.ok = false;
          continue;
        }
        fwd[name].push_back(r->forward_seconds);
        bwd[name].push_back(r->backward_seconds);
        row.max_recv = *std::max_element(r->bytes_received.begin(), r->bytes_received.end());
        row.total_recv = 0;
        for (uint64_t b : r->bytes_received) row.total_recv += b;
        row.ran = hsap::v1::Strategy_Name(r->strategies_run[0]).substr(9);
        row.ok = true;
      }
    }
    for (auto& [name, row] : rows) {
      row.fwd = Median(fwd[name]);
      row.bwd = Median(bwd[name]);
    }
    // The model under the profile node 0 settled for this shape.
    std::string settled;
    if (auto status = (*cluster)->Status(0); status.ok()) {
      const std::string key = absl::StrCat("float32/d", absl::GetFlag(FLAGS_head_dim), " ");
      for (const std::string& p : status->static_profiles()) {
        if (p.rfind(key, 0) == 0) settled = p.substr(key.size());
      }
    }
    const Row& ring = rows["ring"];
    for (const auto& [name, strategy] : strategies) {
      const Row& row = rows[name];
      if (!row.ok) {
        std::printf("  %-9s cannot run: %s\n", name, row.error.substr(0, 100).c_str());
        continue;
      }
      const double total = row.fwd + row.bwd;
      const double ratio = ring.ok ? total / (ring.fwd + ring.bwd) : 0;
      std::string ran = row.ran;
      std::transform(ran.begin(), ran.end(), ran.begin(), ::tolower);
      const double modeled =
          settled.empty() ? 0 : Modeled(cu, nodes, devices, ran, settled).first;
      std::printf("  %-9s %-8s %10.1f %10.1f %10.1f %10.1f %9.3f %14llu %14llu\n", name,
                  row.ran.c_str(), row.fwd * 1e3, row.bwd * 1e3, total * 1e3, modeled, ratio,
                  static_cast<unsigned long long>(row.max_recv),
                  static_cast<unsigned long long>(row.total_recv));
      sum_time[name] += total;
      sum_max_recv[name] += row.max_recv;
    }
    // auto against the fastest of the others on this pack.
    std::string fastest;
    for (const auto& [name, row] : rows) {
      if (name == "auto" || !row.ok) continue;
      if (fastest.empty() || row.fwd + row.bwd < rows[fastest].fwd + rows[fastest].bwd) {
        fastest = name;
      }
    }
    if (!fastest.empty() && rows["auto"].ok) {
      // Side by side: auto over the fastest in each round (the two ran
      // within one round, under the same load), the median over rounds.
      std::vector<double> per_round;
      for (size_t i = 0; i < fwd["auto"].size() && i < fwd[fastest].size(); ++i) {
        per_round.push_back((fwd["auto"][i] + bwd["auto"][i]) /
                            (fwd[fastest][i] + bwd[fastest][i]));
      }
      const double r = Median(per_round);
      const double of_medians = (rows["auto"].fwd + rows["auto"].bwd) /
                                (rows[fastest].fwd + rows[fastest].bwd);
      worst_auto = std::max(worst_auto, r);
      std::printf("  auto ran %s; fastest %s; auto_vs_fastest=%.3f (median of %zu rounds' ratios; "
                  "ratio of the medians %.3f)\n",
                  rows["auto"].ran.c_str(), fastest.c_str(), r, per_round.size(), of_medians);
    }
  }
  // The profile the daemons planned with (node 0 settles the static cluster's).
  if (auto status = (*cluster)->Status(0); status.ok()) {
    std::printf("\ndaemon profile: %s\n", status->profile().c_str());
    for (const std::string& p : status->static_profiles()) std::printf("  settled: %s\n", p.c_str());
  }
  std::printf("\nsummed over the packs (ratios to ring; < 1 is better):\n");
  for (const auto& [name, strategy] : strategies) {
    if (sum_time.count(name) == 0 || sum_time.count("ring") == 0) continue;
    std::printf("  %-9s time %.3f  busiest-rank fwd bytes %.3f\n", name,
                sum_time[name] / sum_time["ring"], sum_max_recv[name] / sum_max_recv["ring"]);
  }
  auto ratio = [&](const char* s) {
    return sum_time.count(s) && sum_time.count("ring") ? sum_time[s] / sum_time["ring"] : 0.0;
  };
  std::printf(
      "sap_vs_ring=%.3f hsap_vs_ring=%.3f auto_vs_ring=%.3f auto_vs_ulysses=%.3f "
      "worst_auto_vs_fastest=%.3f\n",
      ratio("sap"), ratio("hsap"), ratio("auto"),
      sum_time.count("ulysses") ? sum_time["auto"] / sum_time["ulysses"] : 0.0, worst_auto);
  return 0;
}

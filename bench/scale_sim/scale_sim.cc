// scale_sim: the planner's cost model from 8 to 4,096 GPUs (nodes x 8) at
// T = 128K ... 4M tokens on the repository's workload, every strategy, with
// the floors (bench/scale_sim/README.md). Writes a TSV for plot.py and
// prints one table per point.
//
//   bazel build -c opt //bench/scale_sim:scale_sim
//   bazel-bin/bench/scale_sim/scale_sim --out=docs/figures/scale_sim.tsv
//   /usr/bin/python3 bench/scale_sim/plot.py docs/figures/scale_sim.tsv docs/figures
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/scale_sim/sim.h"
#include "common/thread_pool.h"
#include "common/workload.h"

ABSL_FLAG(std::string, nodes, "1,2,4,8,16,32,64,128,256,512", "node counts");
ABSL_FLAG(int32_t, devices_per_node, 8, "GPUs per node");
ABSL_FLAG(std::string, tokens, "131072,262144,524288,1048576,2097152,4194304", "pack sizes T");
ABSL_FLAG(int32_t, heads, 32, "query heads");
ABSL_FLAG(int32_t, kv_heads, 8, "key/value heads");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension");
ABSL_FLAG(std::string, dtype, "bf16", "fp32, bf16 or fp16");
ABSL_FLAG(std::string, profile, "h100", "cost model profile (named or custom:...)");
ABSL_FLAG(int32_t, packs, 3, "packs per point (PackDocuments, seed 2026)");
ABSL_FLAG(std::string, strategies, "ring,allgather,ulysses,usp,sap,hsap,auto", "strategies");
ABSL_FLAG(std::string, max_full_ranks, "ring=512,allgather=512,ulysses=1024,usp=1024,sap=1024",
          "strategy=ranks: above, the row is auto's lower bound of the strategy's modeled "
          "time and closed-form bytes instead of a compiled plan");
ABSL_FLAG(std::string, workload, "", "document lengths (default: the repository's python-stdlib)");
ABSL_FLAG(std::string, out, "", "TSV output path (empty: none)");
ABSL_FLAG(int32_t, compile_threads, 0, "compile pool threads; 0 = hardware threads");
ABSL_FLAG(std::string, dispatch, "hierarchical",
          "hierarchical (balanced as the compiler places it: nodes first) or flat (the "
          "rank-level balanced layout of the same ranks, for a before/after comparison)");

namespace {

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 1) {
      std::fprintf(stderr, "scale_sim: \"%s\" is not a positive integer\n", std::string(p).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using hsap::plan::Strategy;
  hsap::bench::SimOptions o;
  o.shape.num_heads_q = absl::GetFlag(FLAGS_heads);
  o.shape.num_heads_kv = absl::GetFlag(FLAGS_kv_heads);
  o.shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  if (!hsap::ParseDType(absl::GetFlag(FLAGS_dtype), &o.shape.dtype)) {
    std::fprintf(stderr, "scale_sim: --dtype=%s is not fp32, bf16 or fp16\n",
                 absl::GetFlag(FLAGS_dtype).c_str());
    return 2;
  }
  o.profile = absl::GetFlag(FLAGS_profile);
  o.packs = absl::GetFlag(FLAGS_packs);
  if (absl::GetFlag(FLAGS_dispatch) != "hierarchical" && absl::GetFlag(FLAGS_dispatch) != "flat") {
    std::fprintf(stderr, "scale_sim: --dispatch=%s is not hierarchical or flat\n",
                 absl::GetFlag(FLAGS_dispatch).c_str());
    return 2;
  }
  o.flat_dispatch = absl::GetFlag(FLAGS_dispatch) == "flat";
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_strategies), ',', absl::SkipEmpty())) {
    Strategy s;
    if (!hsap::plan::ParseStrategy(name, &s)) {
      std::fprintf(stderr, "scale_sim: unknown strategy \"%s\"\n", std::string(name).c_str());
      return 2;
    }
    o.strategies.push_back(s);
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_max_full_ranks), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, '=');
    Strategy s;
    int32_t v = 0;
    if (!hsap::plan::ParseStrategy(kv.first, &s) || !absl::SimpleAtoi(kv.second, &v)) {
      std::fprintf(stderr, "scale_sim: --max_full_ranks item \"%s\" is not strategy=ranks\n",
                   std::string(item).c_str());
      return 2;
    }
    o.max_full_ranks[s] = v;
  }
  const int threads = absl::GetFlag(FLAGS_compile_threads) > 0
                          ? absl::GetFlag(FLAGS_compile_threads)
                          : std::max(1u, std::thread::hardware_concurrency());
  hsap::ThreadPool pool(threads);
  o.pool = &pool;
  std::string path = absl::GetFlag(FLAGS_workload);
  if (path.empty()) path = hsap::FindWorkload();
  auto lengths = hsap::LoadDocumentLengths(path);
  if (!lengths.ok()) {
    std::fprintf(stderr, "scale_sim: %s\n", lengths.status().ToString().c_str());
    return 1;
  }
  std::printf("scale_sim: %s, Hq %d Hkv %d D %d %s, profile %s, %d packs per point\n",
              path.c_str(), o.shape.num_heads_q, o.shape.num_heads_kv, o.shape.head_dim,
              absl::GetFlag(FLAGS_dtype).c_str(), o.profile.c_str(), o.packs);
  std::string tsv = hsap::bench::TsvHeader();
  for (int64_t t : Ints(absl::GetFlag(FLAGS_tokens))) {
    for (int64_t n : Ints(absl::GetFlag(FLAGS_nodes))) {
      auto point = hsap::bench::SimulatePoint(*lengths, t, static_cast<int32_t>(n),
                                              absl::GetFlag(FLAGS_devices_per_node), o);
      if (!point.ok()) {
        std::fprintf(stderr, "scale_sim: T=%lld nodes=%lld: %s\n", static_cast<long long>(t),
                     static_cast<long long>(n), point.status().ToString().c_str());
        return 1;
      }
      std::printf("\n%s", hsap::bench::FormatPointTable(*point).c_str());
      std::fflush(stdout);
      tsv += hsap::bench::PointTsv(*point);
    }
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    std::ofstream f(absl::GetFlag(FLAGS_out));
    f << tsv;
    if (!f) {
      std::fprintf(stderr, "scale_sim: cannot write %s\n", absl::GetFlag(FLAGS_out).c_str());
      return 1;
    }
  }
  return 0;
}

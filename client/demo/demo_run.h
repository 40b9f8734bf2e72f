// What the demo's processes share: the run's parameters (one struct, passed
// from the coordinator to each rank process as flags), the deterministic
// problem every process rebuilds from them, and the result file a rank
// process writes for each (pack, strategy) and the coordinator reads back.
//
//   DemoRun run = ...;                          // the same in every process
//   DemoProblem p = MakeProblem(run, cu, pack); // identical bits everywhere
//   WriteRankResult(path, result);              // rank process
//   auto r = ReadRankResult(path);              // coordinator
#ifndef HSAP_CLIENT_DEMO_DEMO_RUN_H_
#define HSAP_CLIENT_DEMO_DEMO_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hsap/v1/attention.pb.h"
#include "hsap/v1/common.pb.h"

namespace hsap::demo {

// The strategies command one compares, in table order.
struct StrategyChoice {
  const char* name;
  hsap::v1::Strategy value;
};
const std::vector<StrategyChoice>& DemoStrategies();

// Parameters of one demo run; every process of the run holds the same.
struct DemoRun {
  std::vector<std::string> sockets;  // node n's gRPC socket
  int devices_per_node = 2;
  int64_t tokens = 8192;  // per pack
  int packs = 2;
  uint64_t seed = 10;
  int heads_q = 4;
  int heads_kv = 4;
  int head_dim = 32;
  std::string workload;  // document lengths, one per line
  std::string results_dir;
  std::string run_id;  // makes the group names unique
  int ranks() const { return static_cast<int>(sockets.size()) * devices_per_node; }
};

// One pack's global problem: causal documents, fp32 inputs uniform in
// [-1, 1) drawn from (run.seed, pack).
struct DemoProblem {
  std::vector<int64_t> cu_seqlens;
  std::vector<float> q, k, v, d_o;  // [T, Hq, D], [T, Hkv, D], [T, Hkv, D], [T, Hq, D]
};
DemoProblem MakeProblem(const DemoRun& run, std::vector<int64_t> cu_seqlens, int pack);

// The packs of the run (PackDocuments over the workload's lengths).
absl::StatusOr<std::vector<std::vector<int64_t>>> MakePacks(const DemoRun& run);

// What one rank got for one (pack, strategy): its global token rows, its
// outputs in local order and the daemon's statistics of both calls.
struct RankResult {
  int64_t heads_q = 0, heads_kv = 0, head_dim = 0;
  std::vector<int64_t> tokens;  // global row of each local row
  std::vector<float> o, lse, dq, dk, dv;  // [n, Hq, D], [Hq, n], [n, Hq, D], [n, Hkv, D] x 2
  hsap::v1::CallStats forward, backward;
};

// `<results_dir>/p<pack>-<strategy>-r<rank>.bin`.
std::string ResultPath(const DemoRun& run, int pack, const std::string& strategy, int rank);

// Written to a temporary name, then renamed: a reader sees all or nothing.
absl::Status WriteRankResult(const std::string& path, const RankResult& r);
absl::StatusOr<RankResult> ReadRankResult(const std::string& path);

}  // namespace hsap::demo

#endif  // HSAP_CLIENT_DEMO_DEMO_RUN_H_

// hsap_demo: the README's command one after the daemons are up. Given the
// sockets of a running cluster (nodes x devices), it packs real documents
// (workloads/), computes their float64 reference, starts one separate
// process per rank (this binary with --rank), which run forward + backward
// for ring, ulysses, usp, sap, hsap and auto with only their own tokens,
// then checks every strategy's outputs against the reference and prints one
// table: bytes received by the busiest rank, measured and modeled time,
// worst error. Exit status 0 only when every check passes.
//
//   hsap_demo --sockets=/tmp/n0.sock,/tmp/n1.sock --devices_per_node=2
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/demo/demo_rank.h"
#include "client/demo/demo_run.h"
#include "common/mask.h"
#include "common/workload.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "kernels/cpu/reference.h"

ABSL_FLAG(std::string, sockets, "", "gRPC Unix socket of each node's hsapd, in node order");
ABSL_FLAG(int, devices_per_node, 2, "CPU device slots of each hsapd (--devices=cpu:N)");
ABSL_FLAG(int64_t, tokens, 8192, "tokens per pack");
ABSL_FLAG(int, packs, 2, "packs of documents");
// Seed 10 packs 11 documents of python-stdlib into 2 x 8192 tokens (the
// longest 3150): a mix of documents shorter and longer than a rank's share.
ABSL_FLAG(uint64_t, seed, 10, "packing and data seed");
ABSL_FLAG(int, heads, 4, "query heads");
ABSL_FLAG(int, kv_heads, 4, "key/value heads");
ABSL_FLAG(int, head_dim, 32, "head dimension");
ABSL_FLAG(std::string, workload, "", "document lengths, one per line (default: "
                                     "workloads/python-stdlib.tokens of the repository)");
ABSL_FLAG(std::string, results_dir, "", "where rank processes leave their outputs (default: "
                                        "a temporary folder, removed at the end)");
ABSL_FLAG(int, reference_threads, 2, "threads computing the float64 reference");
ABSL_FLAG(bool, print_errors, false, "print each (pack, strategy)'s error per tensor");
ABSL_FLAG(int, rank, -1, "internal: run as this rank's process (set by the coordinator)");
ABSL_FLAG(std::string, run_id, "", "internal: the coordinator's run id");

namespace {

using hsap::demo::DemoRun;
using hsap::demo::RankResult;
using hsap::kernels::cpu::MaxRelativeError;

constexpr double kTolerance = 1e-5;  // fp32 against the float64 reference

absl::Status WaitFormed(const std::vector<std::string>& sockets, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < sockets.size(); ++i) {
    auto stub = hsap::v1::Cluster::NewStub(
        grpc::CreateChannel("unix:" + sockets[i], grpc::InsecureChannelCredentials()));
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      hsap::v1::GetClusterStatusResponse resp;
      if (stub->GetClusterStatus(&ctx, {}, &resp).ok() && resp.formed()) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("node ", i, " (", sockets[i], ") did not see the cluster formed"));
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  return absl::OkStatus();
}

// The float64 reference of one pack.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// The float64 reference of one pack, one kv head group per task on
// `threads` threads (the heads of a group are independent of the others').
Reference ComputeReference(const DemoRun& run, const hsap::demo::DemoProblem& p, int threads) {
  const int64_t t = p.cu_seqlens.back(), d = run.head_dim;
  const int hq = run.heads_q, hkv = run.heads_kv, rep = hq / hkv;
  hsap::kernels::cpu::AttentionShape shape{rep, 1, run.head_dim, hsap::DType::kFloat32,
                                           1.0f / std::sqrt(static_cast<float>(d))};
  const auto slices = hsap::LowerDocuments(p.cu_seqlens, /*causal=*/true, -1);
  Reference r;
  r.o.resize(t * hq * d);
  r.dq.resize(t * hq * d);
  r.lse.resize(hq * t);
  r.dk.resize(t * hkv * d);
  r.dv.resize(t * hkv * d);
  auto group = [&](int g) {
    // Gather kv head g and its query heads into contiguous tensors.
    std::vector<float> q(t * rep * d), d_o(t * rep * d), k(t * d), v(t * d);
    for (int64_t i = 0; i < t; ++i) {
      std::copy_n(&p.q[(i * hq + g * rep) * d], rep * d, &q[i * rep * d]);
      std::copy_n(&p.d_o[(i * hq + g * rep) * d], rep * d, &d_o[i * rep * d]);
      std::copy_n(&p.k[(i * hkv + g) * d], d, &k[i * d]);
      std::copy_n(&p.v[(i * hkv + g) * d], d, &v[i * d]);
    }
    std::vector<double> o, lse, dq, dk, dv;
    hsap::kernels::cpu::ReferenceForward(shape, q.data(), k.data(), v.data(), t, t, slices, &o,
                                         &lse);
    hsap::kernels::cpu::ReferenceBackward(shape, q.data(), k.data(), v.data(), d_o.data(), t, t,
                                          slices, &dq, &dk, &dv);
    for (int64_t i = 0; i < t; ++i) {
      std::copy_n(&o[i * rep * d], rep * d, &r.o[(i * hq + g * rep) * d]);
      std::copy_n(&dq[i * rep * d], rep * d, &r.dq[(i * hq + g * rep) * d]);
      std::copy_n(&dk[i * d], d, &r.dk[(i * hkv + g) * d]);
      std::copy_n(&dv[i * d], d, &r.dv[(i * hkv + g) * d]);
    }
    for (int h = 0; h < rep; ++h) std::copy_n(&lse[h * t], t, &r.lse[(g * rep + h) * t]);
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      for (int g = w; g < hkv; g += threads) group(g);
    });
  }
  for (auto& th : pool) th.join();
  return r;
}

// Starts this binary once per rank; returns the pids.
std::vector<pid_t> SpawnRanks(const DemoRun& run) {
  std::vector<pid_t> pids;
  for (int r = 0; r < run.ranks(); ++r) {
    std::vector<std::string> args = {
        "hsap_demo", absl::StrCat("--rank=", r),
        absl::StrCat("--sockets=", absl::StrJoin(run.sockets, ",")),
        absl::StrCat("--devices_per_node=", run.devices_per_node),
        absl::StrCat("--tokens=", run.tokens), absl::StrCat("--packs=", run.packs),
        absl::StrCat("--seed=", run.seed), absl::StrCat("--heads=", run.heads_q),
        absl::StrCat("--kv_heads=", run.heads_kv), absl::StrCat("--head_dim=", run.head_dim),
        absl::StrCat("--workload=", run.workload), absl::StrCat("--results_dir=", run.results_dir),
        absl::StrCat("--run_id=", run.run_id)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the coordinator
      execv("/proc/self/exe", argv.data());
      std::perror("hsap_demo: execv");
      _exit(127);
    }
    if (pid > 0) pids.push_back(pid);
  }
  return pids;
}

// Waits for every rank; on the first failure terminates the others (they
// would otherwise wait for the failed rank until the call deadline).
bool WaitRanks(std::vector<pid_t> pids) {
  bool ok = true;
  while (!pids.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    pids.erase(it);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (ok) {
        for (pid_t other : pids) kill(other, SIGTERM);
      }
      ok = false;
    }
  }
  return ok;
}

// One table row, summed over the packs.
struct Row {
  double recv_mb = 0, measured_ms = 0, modeled_ms = 0, worst = 0;
  std::vector<std::string> ran;
  std::string error;
};

double ModeledMs(const std::string& socket, const std::string& plan_key) {
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  hsap::v1::ShowPlanRequest req;
  req.set_plan_key(plan_key);
  hsap::v1::ShowPlanResponse resp;
  if (!plans->ShowPlan(&ctx, req, &resp).ok()) return NAN;
  return resp.summary().modeled_us() / 1e3;
}

std::string LowerName(hsap::v1::Strategy s) {
  std::string name = hsap::v1::Strategy_Name(s).substr(9);  // drop "STRATEGY_"
  for (char& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}

// Reads the ranks' results of one (pack, strategy), adds them to `row`.
absl::Status CheckOne(const DemoRun& run, const hsap::demo::DemoProblem& p, const Reference& ref,
                      int pack, const char* strategy, Row* row) {
  const int64_t t = p.cu_seqlens.back(), hq = run.heads_q, hkv = run.heads_kv,
                d = run.head_dim;
  std::vector<double> o(t * hq * d), lse(hq * t), dq(t * hq * d), dk(t * hkv * d),
      dv(t * hkv * d);
  std::vector<int> seen(t, 0);
  double fwd_ms = 0, bwd_ms = 0, recv = 0;
  std::string plan_key, ran;
  for (int r = 0; r < run.ranks(); ++r) {
    const std::string path = hsap::demo::ResultPath(run, pack, strategy, r);
    auto res = hsap::demo::ReadRankResult(path);
    if (!res.ok()) return res.status();
    std::remove(path.c_str());
    const int64_t n = static_cast<int64_t>(res->tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = res->tokens[i];
      if (g < 0 || g >= t) return absl::DataLossError(absl::StrCat("rank ", r, " row ", g));
      ++seen[g];
      for (int64_t e = 0; e < hq * d; ++e) {
        o[g * hq * d + e] = res->o[i * hq * d + e];
        dq[g * hq * d + e] = res->dq[i * hq * d + e];
      }
      for (int64_t e = 0; e < hkv * d; ++e) {
        dk[g * hkv * d + e] = res->dk[i * hkv * d + e];
        dv[g * hkv * d + e] = res->dv[i * hkv * d + e];
      }
      for (int64_t h = 0; h < hq; ++h) lse[h * t + g] = res->lse[h * n + i];
    }
    const auto& f = res->forward;
    const auto& b = res->backward;
    // Time inside hsapd from the request to the reply, less the time this
    // rank waited for the others to arrive.
    fwd_ms = std::max(fwd_ms, (f.total_seconds() - f.wait_seconds()) * 1e3);
    bwd_ms = std::max(bwd_ms, (b.total_seconds() - b.wait_seconds()) * 1e3);
    recv = std::max(recv, static_cast<double>(f.bytes_received() + b.bytes_received()));
    plan_key = f.plan_key();
    ran = LowerName(f.strategy());
  }
  for (int64_t g = 0; g < t; ++g) {
    if (seen[g] != 1) {
      return absl::DataLossError(absl::StrCat("token ", g, " is held by ", seen[g], " ranks"));
    }
  }
  const double errors[5] = {MaxRelativeError(o, ref.o), MaxRelativeError(lse, ref.lse),
                            MaxRelativeError(dq, ref.dq), MaxRelativeError(dk, ref.dk),
                            MaxRelativeError(dv, ref.dv)};
  if (absl::GetFlag(FLAGS_print_errors)) {
    std::printf("  pack %d %-8s errors O %.3g LSE %.3g dQ %.3g dK %.3g dV %.3g\n", pack, strategy,
                errors[0], errors[1], errors[2], errors[3], errors[4]);
  }
  row->worst = std::max({row->worst, errors[0], errors[1], errors[2], errors[3], errors[4]});
  row->recv_mb += recv / 1e6;
  row->measured_ms += fwd_ms + bwd_ms;
  row->modeled_ms += ModeledMs(run.sockets[0], plan_key);
  if (std::find(row->ran.begin(), row->ran.end(), ran) == row->ran.end()) row->ran.push_back(ran);
  return absl::OkStatus();
}

int Coordinate(DemoRun run) {
  const std::string own_dir = run.results_dir;
  if (run.results_dir.empty()) {
    char tmpl[] = "/tmp/hsap-demo-results.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("hsap_demo: mkdtemp");
      return 1;
    }
    run.results_dir = tmpl;
  }
  if (absl::Status st = WaitFormed(run.sockets, absl::Seconds(60)); !st.ok()) {
    std::fprintf(stderr, "hsap_demo: %s\n", st.ToString().c_str());
    return 1;
  }
  auto packs = hsap::demo::MakePacks(run);
  if (!packs.ok()) {
    std::fprintf(stderr, "hsap_demo: workload: %s\n", packs.status().ToString().c_str());
    return 1;
  }
  std::printf("HSAP demo: %zu nodes x %d CPU devices on loopback (UCX between the daemons), "
              "a group of %d ranks, one process each\n",
              run.sockets.size(), run.devices_per_node, run.ranks());
  std::string shown = run.workload;
  if (const size_t at = shown.rfind("/workloads/"); at != std::string::npos) {
    shown = shown.substr(at + 1);  // the repository's file, not the runfiles path to it
  }
  std::printf("  %d packs of %lld tokens of real documents from %s; Hq=%d Hkv=%d D=%d fp32, "
              "causal documents\n",
              run.packs, static_cast<long long>(run.tokens), shown.c_str(), run.heads_q,
              run.heads_kv, run.head_dim);
  std::vector<hsap::demo::DemoProblem> problems;
  std::vector<Reference> refs;
  for (int pack = 0; pack < static_cast<int>(packs->size()); ++pack) {
    const auto& cu = (*packs)[pack];
    int64_t docs = 0, longest = 0;
    for (size_t i = 1; i < cu.size(); ++i) {
      docs += cu[i] > cu[i - 1];
      longest = std::max(longest, cu[i] - cu[i - 1]);
    }
    const absl::Time t0 = absl::Now();
    problems.push_back(hsap::demo::MakeProblem(run, cu, pack));
    refs.push_back(ComputeReference(run, problems.back(), absl::GetFlag(FLAGS_reference_threads)));
    std::printf("  pack %d: %lld documents (longest %lld tokens); float64 reference in %.1f s\n",
                pack, static_cast<long long>(docs), static_cast<long long>(longest),
                absl::ToDoubleSeconds(absl::Now() - t0));
    std::fflush(stdout);
  }
  std::printf("running forward + backward of every strategy on every pack:\n");
  std::fflush(stdout);
  const bool ranks_ok = WaitRanks(SpawnRanks(run));
  bool ok = ranks_ok;
  std::map<std::string, Row> rows;
  if (ranks_ok) {
    for (const auto& s : hsap::demo::DemoStrategies()) {
      Row& row = rows[s.name];
      for (int pack = 0; pack < static_cast<int>(problems.size()); ++pack) {
        absl::Status st = CheckOne(run, problems[pack], refs[pack], pack, s.name, &row);
        if (!st.ok()) {
          row.error = st.ToString();
          ok = false;
          break;
        }
      }
      ok &= row.error.empty() && row.worst <= kTolerance;
    }
  }
  if (own_dir.empty()) std::filesystem::remove_all(run.results_dir);
  if (!ranks_ok) {
    std::printf("CHECK FAILED: a rank process failed (its message is above)\n");
    return 1;
  }
  std::printf("\n%-9s %-12s %14s %13s %12s %12s\n", "strategy", "ran", "recv MB/rank",
              "measured ms", "modeled ms", "worst error");
  for (const auto& s : hsap::demo::DemoStrategies()) {
    const Row& row = rows[s.name];
    if (!row.error.empty()) {
      std::printf("%-9s %s\n", s.name, row.error.c_str());
      continue;
    }
    std::printf("%-9s %-12s %14.2f %13.1f %12.1f %12.2e\n", s.name,
                absl::StrJoin(row.ran, "/").c_str(), row.recv_mb, row.measured_ms, row.modeled_ms,
                row.worst);
  }
  std::printf("(summed over the packs. recv MB/rank: K/V and gradient bytes received by the "
              "busiest rank, forward + backward; measured: the slowest rank's time inside hsapd, "
              "forward + backward, less its wait for the other ranks; modeled: the planner's "
              "cost model (profile cpu-loopback: one core per rank); worst error: max relative "
              "error of O, LSE, dQ, dK, dV against float64)\n");
  std::printf("CHECK %s: %s\n", ok ? "PASSED" : "FAILED",
              ok ? "every strategy matches the float64 reference within 1e-05"
                 : "a strategy failed or exceeded 1e-05 (see the table)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  DemoRun run;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sockets), ',', absl::SkipEmpty())) {
    run.sockets.emplace_back(s);
  }
  if (run.sockets.empty()) {
    std::fprintf(stderr, "hsap_demo: --sockets is empty (scripts/demo.sh starts the cluster)\n");
    return 2;
  }
  run.devices_per_node = absl::GetFlag(FLAGS_devices_per_node);
  run.tokens = absl::GetFlag(FLAGS_tokens);
  run.packs = absl::GetFlag(FLAGS_packs);
  run.seed = absl::GetFlag(FLAGS_seed);
  run.heads_q = absl::GetFlag(FLAGS_heads);
  run.heads_kv = absl::GetFlag(FLAGS_kv_heads);
  run.head_dim = absl::GetFlag(FLAGS_head_dim);
  run.workload = absl::GetFlag(FLAGS_workload);
  if (run.workload.empty()) run.workload = hsap::FindWorkload();
  run.results_dir = absl::GetFlag(FLAGS_results_dir);
  const int rank = absl::GetFlag(FLAGS_rank);
  if (rank >= 0) {
    run.run_id = absl::GetFlag(FLAGS_run_id);
    absl::Status st = hsap::demo::RunRank(run, rank);
    if (!st.ok()) {
      std::fprintf(stderr, "hsap_demo: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  run.run_id = absl::StrCat(getpid());
  return Coordinate(run);
}

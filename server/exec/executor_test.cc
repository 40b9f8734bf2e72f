// End-to-end tests of the executor: P rank threads run compiled plans over
// the in-process fabric, forward and backward; the outputs, reassembled in
// global token order, are compared with the float64 reference on the whole
// problem. Also: transport byte counts equal the plan's RankStats, executed
// area equals the plan's, error does not grow with P, and faults (a missing
// rank, AbortAll) end every rank promptly with the right status.
#include "server/exec/executor.h"

#include <set>
#include <tuple>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference.h"
#include "server/exec/cpu_backend.h"
#include "server/plan/compiler.h"
#include "server/transport/inprocess_transport.h"
#include "tests/sanitizers/sweep.h"

namespace hsap::exec {
namespace {

namespace kc = kernels::cpu;
using plan::Plan;
using plan::PlanSpec;
using plan::Strategy;

constexpr double kTolerance = 1e-5;

// max |a - b| / max |b|; the absolute error when b is identically zero.
// -inf entries (rows that see no key) must match exactly.
double Error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

struct Problem {
  PlanSpec spec;
  kc::AttentionShape shape;
  std::vector<float> q, k, v, d_o;  // global, [T, H, D]
};

struct Outcome {
  std::vector<double> o, lse, dq, dk, dv;  // global order; lse [Hq, T]
  std::vector<ExecStats> fwd, bwd;
  std::vector<absl::Status> fwd_status, bwd_status;
};

// Every rank's rows in assignment order: local row -> global token.
std::vector<int64_t> RowsOf(const Plan& plan, int32_t r) {
  std::vector<int64_t> rows;
  for (const plan::TokenRange& t : plan.dispatch.ranges[r]) {
    for (int64_t x = t.begin; x < t.end; ++x) rows.push_back(x);
  }
  return rows;
}

std::vector<float> Gather(const std::vector<float>& global, const std::vector<int64_t>& rows,
                          int64_t width) {
  std::vector<float> out(rows.size() * width);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(global.data() + rows[i] * width, width, out.data() + i * width);
  }
  return out;
}

// Runs forward then backward on P threads over one fabric, all ranks on
// `shared` (one pool the ranks take turns on), or each rank on a backend of
// its own (one kernel thread each) when `shared` is null.
Outcome RunPlan(const Plan& plan, const Problem& pr, ComputeBackend* shared) {
  const int32_t P = plan.spec.topology.num_ranks();
  const int64_t T = pr.spec.total_tokens;
  const int Hq = pr.shape.num_heads_q, Hkv = pr.shape.num_heads_kv, D = pr.shape.head_dim;
  auto fabric = transport::InProcessFabric::Create(P, plan.spec.topology.devices_per_node);
  EXPECT_TRUE(fabric.ok());
  struct Local {
    std::vector<int64_t> rows;
    std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  };
  std::vector<Local> loc(P);
  for (int32_t r = 0; r < P; ++r) {
    Local& l = loc[r];
    l.rows = RowsOf(plan, r);
    const int64_t n = l.rows.size();
    l.q = Gather(pr.q, l.rows, Hq * D);
    l.k = Gather(pr.k, l.rows, Hkv * D);
    l.v = Gather(pr.v, l.rows, Hkv * D);
    l.d_o = Gather(pr.d_o, l.rows, Hq * D);
    l.o.assign(n * Hq * D, std::nanf(""));
    l.lse.assign(n * Hq, std::nanf(""));
    l.dq.assign(n * Hq * D, std::nanf(""));
    l.dk.assign(n * Hkv * D, std::nanf(""));
    l.dv.assign(n * Hkv * D, std::nanf(""));
  }
  Outcome out;
  out.fwd.resize(P);
  out.bwd.resize(P);
  out.fwd_status.resize(P);
  out.bwd_status.resize(P);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      Local& l = loc[r];
      RankBuffers b{l.q.data(), l.k.data(),  l.v.data(),  l.o.data(), l.lse.data(),
                    l.d_o.data(), l.dq.data(), l.dk.data(), l.dv.data()};
      transport::Transport* t = (*fabric)->endpoint(r);
      CpuBackend own(1);
      ComputeBackend* backend = shared != nullptr ? shared : &own;
      out.fwd_status[r] = RunForward(plan, r, pr.shape, b, t, backend, deadline, 1, &out.fwd[r]);
      if (!out.fwd_status[r].ok()) return;
      out.bwd_status[r] = RunBackward(plan, r, pr.shape, b, t, backend, deadline, 1, &out.bwd[r]);
    });
  }
  for (auto& th : threads) th.join();
  out.o.assign(T * Hq * D, 0);
  out.lse.assign(Hq * T, 0);
  out.dq.assign(T * Hq * D, 0);
  out.dk.assign(T * Hkv * D, 0);
  out.dv.assign(T * Hkv * D, 0);
  for (int32_t r = 0; r < P; ++r) {
    const Local& l = loc[r];
    const int64_t n = l.rows.size();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = l.rows[i];
      for (int64_t e = 0; e < Hq * D; ++e) {
        out.o[g * Hq * D + e] = l.o[i * Hq * D + e];
        out.dq[g * Hq * D + e] = l.dq[i * Hq * D + e];
      }
      for (int64_t e = 0; e < Hkv * D; ++e) {
        out.dk[g * Hkv * D + e] = l.dk[i * Hkv * D + e];
        out.dv[g * Hkv * D + e] = l.dv[i * Hkv * D + e];
      }
      for (int h = 0; h < Hq; ++h) out.lse[h * T + g] = l.lse[h * n + i];
    }
  }
  return out;
}

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

Reference ComputeReference(const Problem& pr) {
  Reference ref;
  const std::vector<MaskSlice> slices = plan::ResolveSlices(pr.spec);
  const int64_t T = pr.spec.total_tokens;
  kc::ReferenceForward(pr.shape, pr.q.data(), pr.k.data(), pr.v.data(), T, T, slices, &ref.o,
                       &ref.lse);
  kc::ReferenceBackward(pr.shape, pr.q.data(), pr.k.data(), pr.v.data(), pr.d_o.data(), T, T,
                        slices, &ref.dq, &ref.dk, &ref.dv);
  return ref;
}

struct Errors {
  double o = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double Max() const { return std::max({o, lse, dq, dk, dv}); }
};

Errors Compare(const Outcome& out, const Reference& ref) {
  return {Error(out.o, ref.o), Error(out.lse, ref.lse), Error(out.dq, ref.dq),
          Error(out.dk, ref.dk), Error(out.dv, ref.dv)};
}

std::vector<float> RandomTensor(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(n);
  for (float& f : x) f = u(rng);
  return x;
}

void FillTensors(std::mt19937_64& rng, Problem* pr) {
  const int64_t T = pr->spec.total_tokens;
  const int Hq = pr->spec.shape.num_heads_q, Hkv = pr->spec.shape.num_heads_kv;
  const int D = pr->spec.shape.head_dim;
  pr->shape = {Hq, Hkv, D, DType::kFloat32, 1.f / std::sqrt(static_cast<float>(D))};
  pr->q = RandomTensor(rng, T * Hq * D);
  pr->k = RandomTensor(rng, T * Hkv * D);
  pr->v = RandomTensor(rng, T * Hkv * D);
  pr->d_o = RandomTensor(rng, T * Hq * D);
}

// A random packed structure: zero-length and one-token documents, T not
// divisible by P, sometimes one document spanning every rank, causal or
// bidirectional, sometimes a sliding window, GQA shapes including slots that
// split a kv head's q heads, sometimes a tiny receive budget (many stages).
Problem RandomProblem(std::mt19937_64& rng, plan::Topology topo, int case_index) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Problem pr;
  PlanSpec& spec = pr.spec;
  spec.topology = topo;
  const int32_t P = topo.num_ranks();
  static const int kHeads[][2] = {{4, 2}, {5, 1}, {6, 3}, {2, 1}, {3, 3}, {8, 2}};
  const auto& h = kHeads[case_index % 6];
  spec.shape = {h[0], h[1], 32, DType::kFloat32};
  int64_t T = uni(0, 5) == 0 ? uni(0, P + 2) : uni(P, 70);
  if (T % P == 0 && T > 0) ++T;
  spec.total_tokens = T;
  spec.causal = uni(0, 3) != 0;
  spec.window = spec.causal && uni(0, 3) == 0 ? uni(0, 6) : -1;
  spec.cu_seqlens.push_back(0);
  if (case_index % 4 == 1) {
    spec.cu_seqlens.push_back(T);  // one document spanning every rank
  } else {
    int64_t x = 0;
    while (x < T) {
      const int64_t r = uni(0, 9);
      const int64_t len = r == 0 ? 0 : r <= 2 ? 1 : r < 8 ? uni(2, 10) : uni(10, 40);
      x = std::min(T, x + len);
      spec.cu_seqlens.push_back(x);
    }
    if (spec.cu_seqlens.back() != T) spec.cu_seqlens.push_back(T);
  }
  if (uni(0, 2) == 0) {
    spec.recv_buffer_bytes = plan::KvRowBytes(spec.shape, spec.shape.num_heads_kv) * uni(1, 9);
  }
  FillTensors(rng, &pr);
  return pr;
}

std::string Describe(const Problem& pr, Strategy s, plan::AssignmentPolicy a) {
  std::string docs;
  for (size_t i = 1; i < pr.spec.cu_seqlens.size(); ++i) {
    absl::StrAppend(&docs, pr.spec.cu_seqlens[i] - pr.spec.cu_seqlens[i - 1], " ");
  }
  return absl::StrCat(plan::StrategyName(s), "/", plan::AssignmentName(a), " ",
                      pr.spec.topology.num_nodes, "x", pr.spec.topology.devices_per_node,
                      " T=", pr.spec.total_tokens, " Hq=", pr.spec.shape.num_heads_q,
                      " Hkv=", pr.spec.shape.num_heads_kv,
                      pr.spec.causal ? " causal" : " bidirectional", " window=",
                      pr.spec.window, " budget=", pr.spec.recv_buffer_bytes, " docs: ", docs);
}

// Checks one compiled plan end to end: outputs, byte counts, area, budget.
void CheckPlan(const Plan& plan, const Problem& pr, const Reference& ref, ComputeBackend* pool,
               const std::string& what) {
  const Outcome out = RunPlan(plan, pr, pool);
  const int32_t P = plan.spec.topology.num_ranks();
  for (int32_t r = 0; r < P; ++r) {
    ASSERT_TRUE(out.fwd_status[r].ok()) << what << " rank " << r << ": " << out.fwd_status[r];
    ASSERT_TRUE(out.bwd_status[r].ok()) << what << " rank " << r << ": " << out.bwd_status[r];
    const plan::RankStats& rs = plan.ranks[r].stats;
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(out.fwd[r].sent_bytes[t], rs.fwd_send_bytes[t]) << what << " rank " << r;
      EXPECT_EQ(out.fwd[r].received_bytes[t], rs.fwd_recv_bytes[t]) << what << " rank " << r;
      EXPECT_EQ(out.bwd[r].sent_bytes[t], rs.bwd_send_bytes[t]) << what << " rank " << r;
      EXPECT_EQ(out.bwd[r].received_bytes[t], rs.bwd_recv_bytes[t]) << what << " rank " << r;
    }
    EXPECT_EQ(out.fwd[r].area, rs.area) << what << " rank " << r;
    EXPECT_EQ(out.bwd[r].area, rs.area) << what << " rank " << r;
    EXPECT_EQ(out.fwd[r].head_area, rs.head_area) << what << " rank " << r;
    EXPECT_LE(out.fwd[r].recv_buffer_bytes, plan.spec.recv_buffer_bytes) << what;
    EXPECT_LE(out.bwd[r].recv_buffer_bytes, 2 * plan.spec.recv_buffer_bytes) << what;
  }
  // The plan's inter-node figures are what the transports moved across
  // nodes; no plan moves less than the layout's inter-node exact need, and
  // hsap (head groups of whole nodes) moves exactly that.
  constexpr int kInter = static_cast<int>(plan::LinkTier::kInterNode);
  const int32_t G = plan.spec.topology.devices_per_node;
  int64_t inter_total = 0, inter_max = 0, node_max = 0;
  for (int32_t n = 0; n < plan.spec.topology.num_nodes; ++n) {
    int64_t node = 0;
    for (int32_t r = n * G; r < (n + 1) * G; ++r) {
      node += out.fwd[r].received_bytes[kInter];
      inter_max = std::max(inter_max, out.fwd[r].received_bytes[kInter]);
    }
    inter_total += node;
    node_max = std::max(node_max, node);
  }
  EXPECT_EQ(inter_total, plan.stats.total_fwd_bytes_by_tier[kInter]) << what;
  EXPECT_EQ(inter_max, plan.stats.max_fwd_inter_recv_bytes) << what;
  if (G % plan.head_group_size == 0) {  // queries stay on their node (not ulysses across nodes)
    EXPECT_GE(inter_total, plan.stats.inter_node_need_bytes) << what;
    EXPECT_GE(node_max, plan.stats.max_node_inter_need_bytes) << what;
  }
  if (plan.strategy == Strategy::kHsap && plan.head_group_size == G &&
      plan.spec.shape.num_heads_kv % G == 0) {  // each rank its own KV heads
    EXPECT_EQ(inter_total, plan.stats.inter_node_need_bytes) << what;
  }
  if (plan.spec.topology.num_nodes == 1) {
    EXPECT_EQ(plan.stats.inter_node_need_bytes, 0) << what;
  }
  const Errors e = Compare(out, ref);
  EXPECT_LE(e.o, kTolerance) << what;
  EXPECT_LE(e.lse, kTolerance) << what;
  EXPECT_LE(e.dq, kTolerance) << what;
  EXPECT_LE(e.dk, kTolerance) << what;
  EXPECT_LE(e.dv, kTolerance) << what;
}

constexpr Strategy kStrategies[] = {Strategy::kRing,    Strategy::kAllGather, Strategy::kUlysses,
                                    Strategy::kUsp,     Strategy::kSap,       Strategy::kHsap,
                                    Strategy::kAuto};
constexpr plan::AssignmentPolicy kAssignments[] = {plan::AssignmentPolicy::kContiguous,
                                                   plan::AssignmentPolicy::kZigzag,
                                                   plan::AssignmentPolicy::kBalanced};

class ExecutorMatrixTest : public ::testing::TestWithParam<plan::Topology> {};

TEST_P(ExecutorMatrixTest, EveryStrategyAndAssignmentMatchesReference) {
  const plan::Topology topo = GetParam();
  std::mt19937_64 rng(1000 + topo.num_nodes * 10 + topo.devices_per_node);
  CpuBackend pool(2);
  int compiled = 0, failed_compile = 0, kept = 0;
  constexpr int kCases = 20;
  for (int c = 0; c < kCases; ++c) {
    Problem pr = RandomProblem(rng, topo, c);
    if (!sweep::Keeps(c)) continue;
    ++kept;
    const Reference ref = ComputeReference(pr);
    for (Strategy s : kStrategies) {
      for (plan::AssignmentPolicy a : kAssignments) {
        pr.spec.strategy = s;
        pr.spec.assignment = a;
        auto plan = plan::CompilePlan(pr.spec);
        const std::string what = Describe(pr, s, a);
        if (!plan.ok()) {
          ++failed_compile;
          ADD_FAILURE() << what << ": " << plan.status();
          continue;
        }
        ++compiled;
        // Alternate between a shared pool and the rank threads alone.
        CheckPlan(*plan, pr, ref, (c + static_cast<int>(s)) % 2 ? &pool : nullptr, what);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
  EXPECT_EQ(compiled, kept * 21);
  EXPECT_EQ(kept, sweep::Kept(kCases));
  EXPECT_EQ(failed_compile, 0);
}

INSTANTIATE_TEST_SUITE_P(Topologies, ExecutorMatrixTest,
                         ::testing::Values(plan::Topology{1, 1}, plan::Topology{1, 4},
                                           plan::Topology{2, 2}, plan::Topology{3, 2},
                                           plan::Topology{4, 2}),
                         [](const ::testing::TestParamInfo<plan::Topology>& info) {
                           return absl::StrCat(info.param.num_nodes, "x",
                                               info.param.devices_per_node);
                         });

// A fixed structure (a long document, short ones, a one-token one) at
// P = 1, 2, 4, 8: the error of every output must stay within tolerance and
// not grow with the number of ranks.
TEST(ExecutorScaling, ErrorDoesNotGrowWithRanks) {
  const plan::Topology topos[] = {{1, 1}, {1, 2}, {2, 2}, {2, 4}};
  std::printf("%-8s %3s %10s %10s %10s %10s %10s\n", "strategy", "P", "O", "LSE", "dQ", "dK",
              "dV");
  for (Strategy s : {Strategy::kRing, Strategy::kSap, Strategy::kHsap, Strategy::kUlysses}) {
    double first = -1;
    for (const plan::Topology& topo : topos) {
      std::mt19937_64 rng(7);  // same tensors for every P
      Problem pr;
      pr.spec.topology = topo;
      pr.spec.shape = {8, 2, 32, DType::kFloat32};
      pr.spec.cu_seqlens = {0, 150, 151, 170, 200, 230, 233};
      pr.spec.total_tokens = 233;
      pr.spec.strategy = s;
      pr.spec.assignment = plan::AssignmentPolicy::kZigzag;
      FillTensors(rng, &pr);
      auto plan = plan::CompilePlan(pr.spec);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const Outcome out = RunPlan(*plan, pr, nullptr);
      for (const absl::Status& st : out.bwd_status) ASSERT_TRUE(st.ok()) << st;
      const Errors e = Compare(out, ComputeReference(pr));
      std::printf("%-8s %3d %10.2e %10.2e %10.2e %10.2e %10.2e\n",
                  std::string(plan::StrategyName(s)).c_str(), topo.num_ranks(), e.o, e.lse, e.dq,
                  e.dk, e.dv);
      EXPECT_LE(e.Max(), kTolerance) << plan::StrategyName(s) << " P=" << topo.num_ranks();
      if (first < 0) first = e.Max();
      // "Does not grow": within a small factor of the single-rank error (or
      // of fp32 epsilon-scale noise when that is tiny).
      EXPECT_LE(e.Max(), std::max(8 * first, 2e-6)) << plan::StrategyName(s) << " P="
                                                     << topo.num_ranks();
    }
  }
}

Problem FaultProblem(int32_t nodes, int32_t devices) {
  std::mt19937_64 rng(3);
  Problem pr;
  pr.spec.topology = {nodes, devices};
  pr.spec.shape = {2, 1, 32, DType::kFloat32};
  pr.spec.cu_seqlens = {0, 40};
  pr.spec.total_tokens = 40;
  pr.spec.strategy = Strategy::kAllGather;  // every rank receives from every other
  pr.spec.assignment = plan::AssignmentPolicy::kContiguous;
  FillTensors(rng, &pr);
  return pr;
}

struct RankData {
  std::vector<float> q, k, v, o, lse;
};

// Runs forward on ranks `run` (others absent) with `deadline`; `during` runs
// on the test thread meanwhile.
std::vector<absl::Status> RunSome(const Plan& plan, const Problem& pr,
                                  transport::InProcessFabric* fabric,
                                  const std::vector<int32_t>& run, absl::Time deadline,
                                  const std::function<void()>& during) {
  const int32_t P = plan.spec.topology.num_ranks();
  std::vector<RankData> data(P);
  std::vector<absl::Status> status(P);
  std::vector<std::thread> threads;
  for (int32_t r : run) {
    threads.emplace_back([&, r] {
      RankData& d = data[r];
      const std::vector<int64_t> rows = RowsOf(plan, r);
      d.q = Gather(pr.q, rows, 2 * 32);
      d.k = Gather(pr.k, rows, 32);
      d.v = Gather(pr.v, rows, 32);
      d.o.resize(rows.size() * 64);
      d.lse.resize(rows.size() * 2);
      RankBuffers b{d.q.data(), d.k.data(), d.v.data(), d.o.data(), d.lse.data()};
      CpuBackend backend(1);
      status[r] =
          RunForward(plan, r, pr.shape, b, fabric->endpoint(r), &backend, deadline, 5, nullptr);
    });
  }
  during();
  for (auto& t : threads) t.join();
  return status;
}

TEST(ExecutorFaults, MissingRankGivesDeadlineExceededOnEveryOther) {
  const Problem pr = FaultProblem(2, 2);
  auto plan = plan::CompilePlan(pr.spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto fabric = transport::InProcessFabric::Create(4, 2);
  ASSERT_TRUE(fabric.ok());
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Milliseconds(300);
  const auto status = RunSome(*plan, pr, fabric->get(), {1, 2, 3}, deadline, [] {});
  const absl::Duration took = absl::Now() - start;
  for (int32_t r = 1; r < 4; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("receive from rank 0"), std::string::npos) << status[r];
  }
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Milliseconds(300) + absl::Seconds(2));
}

TEST(ExecutorFaults, AbortAllEndsEveryRankPromptly) {
  const Problem pr = FaultProblem(2, 2);
  auto plan = plan::CompilePlan(pr.spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto fabric = transport::InProcessFabric::Create(4, 2);
  ASSERT_TRUE(fabric.ok());
  const absl::Time start = absl::Now();
  // Rank 0 is late: ranks 1..3 are blocked in their first stage when the
  // fabric aborts; rank 0 then starts into an aborted endpoint.
  const auto status = RunSome(*plan, pr, fabric->get(), {1, 2, 3}, start + absl::Seconds(60), [&] {
    absl::SleepFor(absl::Milliseconds(100));
    (*fabric)->AbortAll(absl::AbortedError("peer node 1 lost"));
  });
  const auto status0 = RunSome(*plan, pr, fabric->get(), {0}, start + absl::Seconds(60), [] {});
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (int32_t r = 1; r < 4; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kAborted) << status[r];
    EXPECT_EQ(status[r].message(), "peer node 1 lost");
  }
  EXPECT_EQ(status0[0].code(), absl::StatusCode::kAborted) << status0[0];
}

TEST(ExecutorValidation, RejectsMismatchedShapeRankAndBuffers) {
  const Problem pr = FaultProblem(1, 2);
  auto plan = plan::CompilePlan(pr.spec);
  ASSERT_TRUE(plan.ok());
  auto fabric = transport::InProcessFabric::Create(2, 2);
  ASSERT_TRUE(fabric.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  kc::AttentionShape bad = pr.shape;
  bad.num_heads_q = 4;
  RankBuffers none;
  CpuBackend cpu(1);
  CpuBackend* backend = &cpu;
  absl::Status s = RunForward(*plan, 0, bad, none, (*fabric)->endpoint(0), backend, deadline, 1,
                              nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("Hq 4"), std::string::npos) << s;
  s = RunForward(*plan, 0, pr.shape, none, (*fabric)->endpoint(1), backend, deadline, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = RunForward(*plan, 0, pr.shape, none, (*fabric)->endpoint(0), backend, deadline, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("null"), std::string::npos) << s;
  s = RunForward(*plan, 0, pr.shape, none, (*fabric)->endpoint(0), backend, deadline,
                 uint64_t{1} << 41, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("call_tag"), std::string::npos) << s;
  s = RunForward(*plan, 0, pr.shape, none, (*fabric)->endpoint(0), nullptr, deadline, 1, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("backend"), std::string::npos) << s;
}

// Items that compute while transfers fly never read receive rows their
// stage is receiving into (a pipelined plan's read rows of earlier stages),
// items under the returns read home rows only and belong to backward
// stages: a plan (from a peer, say) that breaks any of these is refused
// before anything moves. The compiler's own
// plan for slow compute holds such items and runs; it is mutated on every
// rank so that no rank waits for another.
TEST(ExecutorValidation, ItemsDuringTransfersReadNoRowsInFlight) {
  Problem pr = FaultProblem(2, 2);
  pr.spec.strategy = Strategy::kSap;
  pr.spec.assignment = plan::AssignmentPolicy::kZigzag;  // two pieces per rank
  pr.spec.profile = "custom:flops=5e4,inter_bytes_per_s=2.7e9,intra_bytes_per_s=6e9";
  auto plan = plan::CompilePlan(pr.spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int held_back = 0;
  for (const plan::RankPlan& rp : plan->ranks) {
    for (const plan::Stage& st : rp.backward) held_back += !st.return_overlap_items.empty();
  }
  EXPECT_GT(held_back, 0);
  const Outcome ok = RunPlan(*plan, pr, nullptr);
  for (int32_t r = 0; r < 4; ++r) {
    EXPECT_TRUE(ok.fwd_status[r].ok() && ok.bwd_status[r].ok())
        << ok.fwd_status[r] << " " << ok.bwd_status[r];
  }
  // One row against receive row 0, which the (one-stage) plan's last stage
  // receives into.
  plan::WorkItem recv_item;
  recv_item.kv_space = plan::RowSpace::kRecv;
  recv_item.num_q = 1;
  recv_item.num_k = 1;
  struct Case {
    bool backward;
    const char* list;
    const char* error;
  };
  for (const Case& c : {Case{false, "return_overlap_items", "return_overlap_items in a forward"},
                        Case{true, "return_overlap_items", "under the returns reads kv space 2"},
                        Case{false, "overlap_items", "this stage's receives are writing"}}) {
    Plan bad = *plan;
    for (plan::RankPlan& rp : bad.ranks) {
      plan::Stage& st = (c.backward ? rp.backward : rp.forward).back();
      (std::string(c.list) == "overlap_items" ? st.overlap_items : st.return_overlap_items)
          .push_back(recv_item);
    }
    const Outcome got = RunPlan(bad, pr, nullptr);
    for (int32_t r = 0; r < 4; ++r) {
      const absl::Status& s = c.backward ? got.bwd_status[r] : got.fwd_status[r];
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << c.list << ": " << s;
      EXPECT_NE(s.message().find(c.error), std::string::npos) << c.list << ": " << s;
    }
  }
}

// The tag layout is call_tag << 24 | pass << 23 | stage << 1 | phase, and
// no two (call, pass, stage, phase) in range share a tag.
TEST(ExecutorTags, LayoutAndInjectivity) {
  EXPECT_EQ(ExchangeTag(0, 0, 0, 0), 0u);
  EXPECT_EQ(ExchangeTag(0, 0, 0, 1), 1u);
  EXPECT_EQ(ExchangeTag(0, 0, 1, 0), 2u);
  EXPECT_EQ(ExchangeTag(0, 1, 0, 0), uint64_t{1} << 23);
  EXPECT_EQ(ExchangeTag(1, 0, 0, 0), uint64_t{1} << 24);
  EXPECT_EQ(ExchangeTag((uint64_t{1} << 40) - 1, 1, (1 << 22) - 1, 1), ~uint64_t{0});
  std::set<uint64_t> seen;
  size_t n = 0;
  for (uint64_t call : {uint64_t{0}, uint64_t{1}, uint64_t{2}, (uint64_t{1} << 40) - 1}) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int32_t stage : {0, 1, 2, 1000, (1 << 22) - 2, (1 << 22) - 1}) {
        for (int phase = 0; phase < 2; ++phase) {
          seen.insert(ExchangeTag(call, pass, stage, phase));
          ++n;
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), n);
}

}  // namespace
}  // namespace hsap::exec

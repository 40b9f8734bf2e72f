// Golden hashes for refactors that must not change a bit: prints one line
// per configuration with a hash of the compiled plan (its proto encoding,
// compile time zeroed) and, for the executor configurations, a hash of every
// output of forward + backward (O, LSE, dQ, dK, dV, in each rank's local
// order) on fixed pseudo-random inputs, run over the in-process fabric.
// Run the binary before and after a change and diff the outputs:
//
//   bazel build //tests/golden:golden_hashes
//   bazel-bin/tests/golden/golden_hashes > /tmp/before.txt
//   (change, rebuild)
//   bazel-bin/tests/golden/golden_hashes > /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt
//
// Not a test (it asserts nothing by itself): a tool for a before/after diff.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/workload.h"
#include "server/plan/compiler.h"
#include "server/plan/plan_proto.h"
#include "tests/golden/run_rank.h"

ABSL_FLAG(bool, plans, true, "hash the plan bench's configurations (T = 64K)");
ABSL_FLAG(bool, exec, true, "hash executor outputs on small random problems");
ABSL_FLAG(int, kernel_threads, 1, "threads of the kernels' pool");

namespace hsap::golden {
namespace {

using plan::AssignmentPolicy;
using plan::Plan;
using plan::PlanSpec;
using plan::Strategy;

uint64_t Fnv(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t PlanHash(Plan plan) {
  plan.stats.compile_us = 0;
  std::string bytes;
  hsap::v1::Plan proto = plan::PlanToProto(plan);
  proto.SerializeToString(&bytes);
  return Fnv(bytes.data(), bytes.size());
}

constexpr Strategy kStrategies[] = {Strategy::kRing, Strategy::kAllGather, Strategy::kUlysses,
                                    Strategy::kUsp,  Strategy::kSap,       Strategy::kHsap,
                                    Strategy::kAuto};
constexpr AssignmentPolicy kAssignments[] = {AssignmentPolicy::kContiguous,
                                             AssignmentPolicy::kZigzag,
                                             AssignmentPolicy::kBalanced};

void HashPlans() {
  auto lengths = LoadDocumentLengths(FindWorkload());
  if (!lengths.ok()) {
    std::printf("workload: %s\n", lengths.status().ToString().c_str());
    return;
  }
  const auto packs = PackDocuments(*lengths, 65536, 3, 1);
  for (int p = 0; p < 3; ++p) {
    for (int32_t ranks : {8, 64}) {
      for (Strategy s : kStrategies) {
        for (AssignmentPolicy a : kAssignments) {
          PlanSpec spec;
          spec.cu_seqlens = packs[p];
          spec.total_tokens = 65536;
          spec.topology = {ranks / 8, 8};
          spec.shape = {32, 8, 128, DType::kBFloat16};
          spec.strategy = s;
          spec.assignment = a;
          auto plan = plan::CompilePlan(spec);
          std::printf("plan pack=%d P=%d %s %s: %s\n", p, ranks,
                      std::string(plan::StrategyName(s)).c_str(),
                      std::string(plan::AssignmentName(a)).c_str(),
                      plan.ok() ? absl::StrCat(PlanHash(*plan)).c_str()
                                : plan.status().ToString().c_str());
        }
      }
    }
  }
}

std::vector<int64_t> RandomDocs(int64_t T, std::mt19937_64* rng) {
  std::vector<int64_t> cu = {0};
  while (cu.back() < T) {
    const int64_t len = std::min<int64_t>(T - cu.back(), (*rng)() % 400 == 0 ? 0 : 1 + (*rng)() % 300);
    cu.push_back(cu.back() + len);
  }
  return cu;
}

void FillRandom(DType dtype, int64_t n, std::mt19937_64* rng, std::vector<char>* out) {
  out->assign(n * DTypeSize(dtype), 0);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < n; ++i) StoreFromFloat(out->data(), dtype, i, u(*rng));
}

// Runs one configuration's forward and backward and hashes every output.
std::string ExecHash(const Plan& plan, const kernels::AttentionShapeForGolden& shape,
                     std::mt19937_64* rng) {
  const int32_t P = plan.spec.topology.num_ranks();
  const int Hq = shape.num_heads_q, Hkv = shape.num_heads_kv, D = shape.head_dim;
  const int64_t es = DTypeSize(shape.dtype);
  struct Local {
    std::vector<char> q, k, v, o, d_o, dq, dk, dv;
    std::vector<float> lse;
  };
  std::vector<Local> loc(P);
  for (int32_t r = 0; r < P; ++r) {
    const int64_t n = plan.dispatch.TokensOf(r);
    Local& l = loc[r];
    FillRandom(shape.dtype, n * Hq * D, rng, &l.q);
    FillRandom(shape.dtype, n * Hkv * D, rng, &l.k);
    FillRandom(shape.dtype, n * Hkv * D, rng, &l.v);
    FillRandom(shape.dtype, n * Hq * D, rng, &l.d_o);
    l.o.assign(n * Hq * D * es, 0x5a);
    l.dq.assign(n * Hq * D * es, 0x5a);
    l.dk.assign(n * Hkv * D * es, 0x5a);
    l.dv.assign(n * Hkv * D * es, 0x5a);
    l.lse.assign(n * Hq, 7.f);
  }
  std::vector<RankTensors> tensors(P);
  for (int32_t r = 0; r < P; ++r) {
    Local& l = loc[r];
    tensors[r] = {l.q.data(), l.k.data(), l.v.data(), l.o.data(), l.lse.data(),
                  l.d_o.data(), l.dq.data(), l.dk.data(), l.dv.data()};
  }
  const std::string error = RunGroup(plan, shape, tensors, absl::GetFlag(FLAGS_kernel_threads));
  if (!error.empty()) return error;
  uint64_t h = 1469598103934665603ull;
  for (const Local& l : loc) {
    for (const std::vector<char>* b : {&l.o, &l.dq, &l.dk, &l.dv}) h = Fnv(b->data(), b->size(), h);
    h = Fnv(l.lse.data(), l.lse.size() * sizeof(float), h);
  }
  return absl::StrCat(h);
}

void HashExec() {
  struct Shape {
    int hq, hkv, d;
  };
  const Shape shapes[] = {{4, 2, 32}, {6, 2, 64}, {4, 4, 32}, {5, 1, 32}};
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const std::pair<int32_t, int32_t> topologies[] = {{1, 1}, {1, 2}, {1, 3}, {2, 2}, {1, 4},
                                                    {2, 3}, {4, 2}, {1, 8}};
  int config = 0;
  for (auto [nodes, devices] : topologies) {
    for (Strategy s : kStrategies) {
      for (AssignmentPolicy a : kAssignments) {
        // One deterministic draw per configuration.
        std::mt19937_64 rng(1000 + config);
        const Shape& sh = shapes[config % 4];
        const DType dtype = dtypes[config % 3];
        const int mask_kind = config % 3;  // causal, full, causal window
        ++config;
        const int64_t T = 200 + rng() % 500;
        PlanSpec spec;
        spec.cu_seqlens = RandomDocs(T, &rng);
        spec.total_tokens = T;
        spec.causal = mask_kind != 1;
        spec.window = mask_kind == 2 ? 37 : -1;
        spec.topology = {nodes, devices};
        spec.shape = {sh.hq, sh.hkv, sh.d, dtype};
        spec.strategy = s;
        spec.assignment = a;
        spec.profile = "cpu-loopback";
        auto plan = plan::CompilePlan(spec);
        const std::string name = absl::StrCat(
            "exec ", nodes, "x", devices, " ", plan::StrategyName(s), " ", plan::AssignmentName(a),
            " Hq", sh.hq, " Hkv", sh.hkv, " D", sh.d, " ", DTypeName(dtype), " mask", mask_kind,
            " T", T);
        if (!plan.ok()) {
          std::printf("%s: %s\n", name.c_str(), plan.status().ToString().c_str());
          continue;
        }
        kernels::AttentionShapeForGolden shape;
        shape.num_heads_q = sh.hq;
        shape.num_heads_kv = sh.hkv;
        shape.head_dim = sh.d;
        shape.dtype = dtype;
        shape.softmax_scale = 0.125f + 0.01f * (config % 7);
        std::printf("%s: plan %llu out %s\n", name.c_str(),
                    static_cast<unsigned long long>(PlanHash(*plan)),
                    ExecHash(*plan, shape, &rng).c_str());
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace hsap::golden

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_plans)) hsap::golden::HashPlans();
  if (absl::GetFlag(FLAGS_exec)) hsap::golden::HashExec();
  return 0;
}

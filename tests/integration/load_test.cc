// Load: 8 concurrent trainer clients against a 2-node loopback cluster of
// real hsapd processes (2 CPU device slots each, UCX over tcp between the
// nodes), each client making a long run of mixed forward and backward calls
// over varied document structures, strategies and assignments:
//   * clients 0-3 form group A and clients 4-7 group B, 4 ranks each
//     (ranks 0, 1 on node 0; 2, 3 on node 1): cross-node calls;
//   * the same clients also call in node-local pairs (A-n0 = clients 0, 1 on
//     node 0, A-n1 = 2, 3 on node 1, likewise for B) and alone (one-rank
//     groups) on their own node.
// Every member of a group follows the same seeded schedule of steps, so the
// collectives always match. A warm-up runs every variant once (forward and
// backward); then the measured run. Reported: p50/p99 latency per kind and
// overall, errors, each daemon's VmRSS, open fds, and /dev/shm entries after
// the warm-up and at the end. Asserted: zero errors, RSS growth <= 10 %, no
// growth of fds or /dev/shm entries.
//
// Soak (5,000 calls per client or more, load_test_soak): resident memory
// first grows while bounded tables fill (plan agreements keep the last 4,096
// calls, allocator arenas warm up), then levels off. The run is split in
// halves and the second half may add at most 3 % (measured: 10,000 and
// 20,000 calls per client end within 1 % of each other, +8.5 % / +10.1 %
// and +8.8 % / +11.3 % over the short warm-up).
//
// Calls per client: HSAP_LOAD_CALLS if set, else 400 (100 under a
// sanitizer, tests/sanitizers/sweep.h). With today's mix (node-local and
// cross-node calls of up to 20 variants) 1,000 per client took 57 s of
// calls on CI's run of 2026-12-06, the longest test of command two's plain
// stage; the soak (load_test_soak) runs 10,000. HSAP_LOAD_FULL=1 asks for
// 1,000.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "tests/integration/local_cluster.h"
#include "tests/sanitizers/sweep.h"

namespace hsap::testing {
namespace {

constexpr int kNodes = 2, kDevices = 2, kClients = 8;
constexpr int64_t kHq = 4, kHkv = 2, kD = 32;

// ---------------------------------------------------------------------------
// /proc and /dev/shm.

int64_t VmRssKiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
  }
  return -1;
}

std::set<std::string> DirEntries(const std::string& path) {
  std::set<std::string> out;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.' || (e->d_name[1] != '\0' && e->d_name[1] != '.')) out.insert(e->d_name);
  }
  closedir(d);
  return out;
}

int CountFds(pid_t pid) { return static_cast<int>(DirEntries(absl::StrCat("/proc/", pid, "/fd")).size()); }

struct Snapshot {
  std::vector<int64_t> rss_kib;
  std::vector<int> fds;
  std::set<std::string> shm;
};

Snapshot Take(LocalCluster& cluster) {
  Snapshot s;
  for (int i = 0; i < cluster.nodes(); ++i) {
    s.rss_kib.push_back(VmRssKiB(cluster.node(i)->pid()));
    s.fds.push_back(CountFds(cluster.node(i)->pid()));
  }
  // POSIX named semaphores (sem.*) are neither hsapd's nor this test's:
  // tests running beside it make them (Python multiprocessing's sem.mp-*).
  for (const std::string& e : DirEntries("/dev/shm")) {
    if (e.rfind("sem.", 0) != 0) s.shm.insert(e);
  }
  return s;
}

// ---------------------------------------------------------------------------
// Workload variants.

enum Kind { kSolo = 0, kPair = 1, kCross = 2 };
const char* const kKindName[] = {"solo (1 rank)", "pair (1x2 node-local)", "cross (2x2 nodes)"};

struct Variant {
  std::vector<int64_t> cu;
  bool causal = true;
  hsap::v1::Strategy strategy = hsap::v1::STRATEGY_AUTO;
  hsap::v1::AssignmentPolicy assignment = hsap::v1::ASSIGNMENT_BALANCED;
  std::vector<int64_t> tokens;  // per rank of the group
};

std::vector<std::vector<int64_t>> Structures() {
  std::vector<std::vector<int64_t>> s = {{0, 256},
                                         {0, 64, 128, 192, 256},
                                         {0, 5, 5, 90, 91, 150, 256},
                                         {0, 200, 256},
                                         {0, 17, 100, 131, 240},
                                         {0, 1, 33, 34, 128}};
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 4; ++i) {
    const int64_t total = 64 + static_cast<int64_t>(rng() % 193);  // [64, 256]
    const int docs = 1 + static_cast<int>(rng() % 8);
    std::set<int64_t> cuts = {0, total};
    while (static_cast<int>(cuts.size()) < docs + 1) cuts.insert(1 + rng() % (total - 1));
    s.emplace_back(cuts.begin(), cuts.end());
  }
  return s;
}

// Every (structure, causal, strategy, assignment) the planner lays out for
// `ranks` ranks on `nodes` nodes, then a seeded sample of `keep` of them.
std::vector<Variant> Variants(hsap::v1::Plans::Stub* plans, int nodes, int per_node, size_t keep,
                              uint64_t seed) {
  std::vector<Variant> all;
  for (const auto& cu : Structures()) {
    for (bool causal : {true, false}) {
      for (auto strategy : {hsap::v1::STRATEGY_RING, hsap::v1::STRATEGY_ALLGATHER,
                            hsap::v1::STRATEGY_ULYSSES, hsap::v1::STRATEGY_USP,
                            hsap::v1::STRATEGY_SAP, hsap::v1::STRATEGY_HSAP,
                            hsap::v1::STRATEGY_AUTO}) {
        for (auto assignment : {hsap::v1::ASSIGNMENT_CONTIGUOUS, hsap::v1::ASSIGNMENT_ZIGZAG,
                                hsap::v1::ASSIGNMENT_BALANCED}) {
          hsap::v1::DispatchRequest req;
          auto* spec = req.mutable_spec();
          for (int64_t x : cu) spec->add_cu_seqlens(x);
          spec->set_causal(causal);
          spec->set_window(-1);
          spec->set_total_tokens(cu.back());
          spec->mutable_topology()->set_num_nodes(nodes);
          spec->mutable_topology()->set_devices_per_node(per_node);
          spec->mutable_shape()->set_num_heads_q(kHq);
          spec->mutable_shape()->set_num_heads_kv(kHkv);
          spec->mutable_shape()->set_head_dim(kD);
          spec->mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
          spec->set_strategy(strategy);
          spec->set_assignment(assignment);
          spec->set_profile("cpu-loopback");
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
          hsap::v1::DispatchResponse resp;
          if (!plans->Dispatch(&ctx, req, &resp).ok()) continue;  // not applicable
          Variant v{cu, causal, strategy, assignment, {}};
          for (const auto& rank : resp.dispatch().ranks()) {
            int64_t n = 0;
            for (const auto& r : rank.ranges()) n += r.end() - r.begin();
            v.tokens.push_back(n);
          }
          // A rank without tokens cannot describe its tensors; skip.
          if (std::count(v.tokens.begin(), v.tokens.end(), 0) == 0) all.push_back(std::move(v));
        }
      }
    }
  }
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  if (all.size() > keep) all.resize(keep);
  return all;
}

// ---------------------------------------------------------------------------
// Clients.

struct Step {
  Kind kind;
  int variant;
  bool backward;
};

// Client c: group A (c < 4) or B, rank c % 4 of it; node (c % 4) / 2.
struct Trainer {
  int index = 0;
  int node = 0;
  std::unique_ptr<client::Client> client;
  std::map<int64_t, std::unique_ptr<client::AttentionBuffers>> buffers;  // by local tokens
  uint64_t next_seq[3] = {1, 1, 1};
  std::vector<double> latency[3];  // seconds, by kind
  uint64_t bytes_received[3] = {0, 0, 0};  // by kind, as the daemons report
  int errors = 0;
  std::vector<std::string> first_errors;

  std::string Group(Kind k) const {
    const std::string g = index < 4 ? "A" : "B";
    if (k == kCross) return g;
    if (k == kPair) return absl::StrCat(g, "-n", node);
    return absl::StrCat("solo-", index);
  }
  int Rank(Kind k) const { return k == kCross ? index % 4 : k == kPair ? index % 2 : 0; }

  absl::StatusOr<client::AttentionBuffers*> Buffers(int64_t tokens) {
    auto it = buffers.find(tokens);
    if (it != buffers.end()) return it->second.get();
    auto b = client::AttentionBuffers::Create(
        client.get(), {tokens, kHq, kHkv, kD, DType::kFloat32}, absl::StrCat("load-", index, "-", tokens));
    if (!b.ok()) return b.status();
    (*b)->FillInputs(static_cast<uint64_t>(index * 1000 + tokens));
    return (buffers[tokens] = std::move(b).value()).get();
  }

  void Run(const Step& step, const std::vector<Variant>& variants, bool record) {
    const Variant& v = variants[step.variant];
    const int rank = Rank(step.kind);
    hsap::v1::CallId id;
    id.set_group(Group(step.kind));
    id.set_rank(rank);
    id.set_group_size(static_cast<int32_t>(v.tokens.size()));
    id.set_call_seq(next_seq[step.kind]++);
    hsap::v1::CallOptions options;
    options.set_strategy(v.strategy);
    options.set_assignment(v.assignment);
    options.set_deadline_ms(30000);
    const auto mask = client::DocumentMask(v.cu, v.causal);
    absl::Status st;
    hsap::v1::CallStats stats;
    const absl::Time start = absl::Now();
    auto b = Buffers(v.tokens[rank]);
    if (!b.ok()) {
      st = b.status();
    } else if (step.backward) {
      auto r = client->Backward((*b)->BackwardRequest(id, mask, options));
      st = r.status();
      if (r.ok()) stats = r->stats();
    } else {
      auto r = client->Forward((*b)->ForwardRequest(id, mask, options));
      st = r.status();
      if (r.ok()) stats = r->stats();
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    // Every rank holds tokens, and each token sees at least itself (causal)
    // or its whole document: a call that ran computed a positive area.
    if (st.ok() && stats.area() <= 0) {
      st = absl::InternalError(absl::StrCat("the call reports area ", stats.area()));
    }
    if (record && st.ok()) bytes_received[step.kind] += stats.bytes_received();
    if (!st.ok()) {
      ++errors;
      if (first_errors.size() < 5) {
        first_errors.push_back(absl::StrCat(id.group(), "/", id.call_seq(), " rank ", rank, " ",
                                            step.backward ? "bwd" : "fwd", ": ", st.ToString()));
      }
    }
    if (record) latency[step.kind].push_back(seconds);
  }
};

// The schedule of group `g` (0 = A, 1 = B): the same for all its members.
std::vector<Step> Schedule(int g, int calls, const std::vector<Variant>* variants) {
  std::mt19937_64 rng(7919 * (g + 1));
  std::vector<Step> steps;
  for (int s = 0; s < calls; ++s) {
    const uint64_t r = rng() % 10;
    const Kind kind = r < 3 ? kSolo : r < 6 ? kPair : kCross;  // 30 / 30 / 40 %
    steps.push_back({kind, static_cast<int>(rng() % variants[kind].size()), rng() % 2 == 1});
  }
  return steps;
}

std::vector<Step> WarmUp(const std::vector<Variant>* variants) {
  std::vector<Step> steps;
  for (int k = 0; k < 3; ++k) {
    for (int v = 0; v < static_cast<int>(variants[k].size()); ++v) {
      steps.push_back({static_cast<Kind>(k), v, false});
      steps.push_back({static_cast<Kind>(k), v, true});
    }
  }
  return steps;
}

double Percentile(std::vector<double> x, double p) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  const size_t i = std::min(x.size() - 1, static_cast<size_t>(p * (x.size() - 1) + 0.5));
  return x[i];
}

int CallsPerClient() {
  if (const char* n = std::getenv("HSAP_LOAD_CALLS")) return std::max(1, std::atoi(n));
  if (const char* full = std::getenv("HSAP_LOAD_FULL"); full && std::string(full) == "1") {
    return 1000;
  }
  return sweep::kSanitized ? 100 : 400;
}

TEST(LoadTest, EightTrainersMixedCallsOnTwoNodes) {
  const int calls = CallsPerClient();
  const absl::Time t0 = absl::Now();
  auto cluster = LocalCluster::Start(kNodes, kDevices,
                                     {"--cpu_threads=1", "--ucx_transports=tcp", "--heartbeat_ms=200",
                                      "--peer_down_ms=5000"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitFormed(absl::Seconds(30)).ok());
  const auto sockets = (*cluster)->sockets();

  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + sockets[0], grpc::InsecureChannelCredentials()));
  std::vector<Variant> variants[3] = {Variants(plans.get(), 1, 1, 12, 1),
                                      Variants(plans.get(), 1, 2, 16, 2),
                                      Variants(plans.get(), 2, 2, 20, 3)};
  for (int k = 0; k < 3; ++k) ASSERT_FALSE(variants[k].empty()) << kKindName[k];

  std::vector<Trainer> trainers(kClients);
  for (int c = 0; c < kClients; ++c) {
    trainers[c].index = c;
    trainers[c].node = (c % 4) / kDevices;
    auto cl = client::Client::Connect(sockets[trainers[c].node]);
    ASSERT_TRUE(cl.ok()) << cl.status();
    trainers[c].client = std::move(cl).value();
  }
  auto run_all = [&](auto steps_of, bool record) {
    std::vector<std::thread> threads;
    for (auto& t : trainers) {
      threads.emplace_back([&t, &variants, steps_of, record] {
        for (const Step& s : steps_of(t.index < 4 ? 0 : 1)) t.Run(s, variants[s.kind], record);
      });
    }
    for (auto& th : threads) th.join();
  };

  const std::vector<Step> warm = WarmUp(variants);
  run_all([&](int) { return warm; }, false);
  int warm_errors = 0;
  for (auto& t : trainers) {
    warm_errors += t.errors;
    for (const auto& e : t.first_errors) std::printf("warm-up error: %s\n", e.c_str());
    t.errors = 0;
    t.first_errors.clear();
  }
  const Snapshot after_warm = Take(**cluster);
  const absl::Time t1 = absl::Now();

  const std::vector<Step> sched[2] = {Schedule(0, calls, variants), Schedule(1, calls, variants)};
  const bool soak = calls >= 5000;
  Snapshot mid;
  if (soak) {
    // Every group runs the same halves, so the pause between them cannot
    // split a collective.
    std::vector<Step> first[2], second[2];
    for (int g = 0; g < 2; ++g) {
      const size_t half = sched[g].size() / 2;
      first[g].assign(sched[g].begin(), sched[g].begin() + half);
      second[g].assign(sched[g].begin() + half, sched[g].end());
    }
    run_all([&](int g) { return first[g]; }, true);
    mid = Take(**cluster);
    run_all([&](int g) { return second[g]; }, true);
  } else {
    run_all([&](int g) { return sched[g]; }, true);
  }
  const absl::Time t2 = absl::Now();
  // Calls are done; transports of the last calls close asynchronously.
  Snapshot end = Take(**cluster);
  for (int i = 0; i < 50; ++i) {
    bool settled = true;
    for (int n = 0; n < kNodes; ++n) settled &= end.fds[n] <= after_warm.fds[n];
    if (settled) break;
    absl::SleepFor(absl::Milliseconds(100));
    end = Take(**cluster);
  }

  int errors = 0;
  std::vector<double> all;
  std::vector<double> by_kind[3];
  for (auto& t : trainers) {
    errors += t.errors;
    for (const auto& e : t.first_errors) std::printf("error: %s\n", e.c_str());
    for (int k = 0; k < 3; ++k) {
      by_kind[k].insert(by_kind[k].end(), t.latency[k].begin(), t.latency[k].end());
      all.insert(all.end(), t.latency[k].begin(), t.latency[k].end());
    }
  }
  std::printf("\nload: %d clients x %d calls = %zu calls in %.1f s (before: cluster start and "
              "warm-up of %zu steps per client, %.1f s)\n",
              kClients, calls, all.size(), absl::ToDoubleSeconds(t2 - t1), warm.size(),
              absl::ToDoubleSeconds(t1 - t0));
  std::printf("variants: solo %zu, pair %zu, cross %zu\n", variants[0].size(), variants[1].size(),
              variants[2].size());
  std::printf("%-24s %8s %10s %10s %10s\n", "kind", "calls", "p50 ms", "p99 ms", "max ms");
  for (int k = 0; k < 3; ++k) {
    std::printf("%-24s %8zu %10.2f %10.2f %10.2f\n", kKindName[k], by_kind[k].size(),
                1e3 * Percentile(by_kind[k], 0.5), 1e3 * Percentile(by_kind[k], 0.99),
                1e3 * Percentile(by_kind[k], 1.0));
  }
  std::printf("%-24s %8zu %10.2f %10.2f %10.2f\n", "all", all.size(), 1e3 * Percentile(all, 0.5),
              1e3 * Percentile(all, 0.99), 1e3 * Percentile(all, 1.0));
  uint64_t received[3] = {0, 0, 0};
  for (auto& t : trainers) {
    for (int k = 0; k < 3; ++k) received[k] += t.bytes_received[k];
  }
  std::printf("bytes received by ranks from peers: solo %llu, pair %llu, cross %llu\n",
              static_cast<unsigned long long>(received[0]), static_cast<unsigned long long>(received[1]),
              static_cast<unsigned long long>(received[2]));
  std::printf("errors: %d (warm-up: %d)\n", errors, warm_errors);
  for (int n = 0; n < kNodes; ++n) {
    std::printf("node %d: VmRSS %lld KiB after warm-up, %lld KiB at the end (%+.1f%%); fds %d -> %d\n",
                n, static_cast<long long>(after_warm.rss_kib[n]),
                static_cast<long long>(end.rss_kib[n]),
                100.0 * (end.rss_kib[n] - after_warm.rss_kib[n]) / after_warm.rss_kib[n],
                after_warm.fds[n], end.fds[n]);
  }
  std::vector<std::string> new_shm;
  for (const auto& e : end.shm) {
    if (!after_warm.shm.count(e)) new_shm.push_back(e);
  }
  std::printf("/dev/shm entries: %zu after warm-up, %zu at the end (new: %s)\n\n",
              after_warm.shm.size(), end.shm.size(), absl::StrJoin(new_shm, ", ").c_str());

  EXPECT_EQ(warm_errors, 0);
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(all.size(), static_cast<size_t>(kClients) * calls);
  for (int k = 0; k < 3; ++k) EXPECT_GT(by_kind[k].size(), 0u) << kKindName[k];
  EXPECT_EQ(received[kSolo], 0u);  // nothing to exchange in a one-rank group
  EXPECT_GT(received[kPair], 0u);
  EXPECT_GT(received[kCross], 0u);
  for (int n = 0; n < kNodes; ++n) {
    // Under AddressSanitizer the daemon's freed memory waits in ASan's
    // quarantine (256 MB by default) and is not reused, so resident memory
    // grows by design there (+25% / +45% measured); ASan's own leak check
    // covers that build. The plain build asserts the 10% bound.
#if !defined(__SANITIZE_ADDRESS__)
    if (soak) {
      std::printf("node %d: VmRSS %lld KiB at the half, second half %+.1f%%\n", n,
                  static_cast<long long>(mid.rss_kib[n]),
                  100.0 * (end.rss_kib[n] - mid.rss_kib[n]) / mid.rss_kib[n]);
      EXPECT_LE(end.rss_kib[n], mid.rss_kib[n] * 103 / 100) << "node " << n;
    } else {
      EXPECT_LE(end.rss_kib[n], after_warm.rss_kib[n] * 11 / 10) << "node " << n;
    }
#endif
    EXPECT_LE(end.fds[n], after_warm.fds[n]) << "node " << n;
  }
  EXPECT_LE(end.shm.size(), after_warm.shm.size()) << absl::StrJoin(new_shm, ", ");
}

}  // namespace
}  // namespace hsap::testing

// Issue 33 ("Trust between daemons"), what a caller can make the daemon
// spend, against real hsapd processes; each case ends with the daemon
// healthy and computing a correct group call.
//
//  * Unauthenticated flood: 12 clients at once send a 60 MiB
//    Peer.ProbeLink without the token to a daemon with --token_file. The
//    TCP listener's gate (server/grpc/tcp_gate.h) refuses each call at its
//    headers, UNAUTHENTICATED naming the missing token, before gRPC reads
//    its body: the daemon's peak RSS (VmHWM) grows by less than 16 MiB
//    (the issue asks for 64; without the gate, behind only the memory
//    quota, it grew by 24-83 MiB). A 1 MiB probe without the token is
//    UNAUTHENTICATED and a 3 MiB one with it is served, before and after.
//    The same flood at a daemon with neither TLS nor a token nor
//    --insecure_peers, which takes no peer calls: the same bounds.
//  * The open-file limit: under RLIMIT_NOFILE = 256 hsapd caps its sessions
//    at 44; the 45th is RESOURCE_EXHAUSTED naming --max_sessions, the
//    daemon's fds stay below the reserve kept for gRPC, and health answers
//    SERVING on existing and new connections (Unix socket and TCP).
//  * Abandoned compiles: Plans.CompilePlan and Plans.Dispatch over 2^20
//    one-token documents with a 200 ms deadline, or cancelled by the client
//    at 200 ms: the daemon's CPU over the second that starts 0.5 s later is
//    that of an idle daemon. A control compile with a 2 s deadline keeps the
//    same window busy. The request (about 3 MiB) goes over the Unix socket
//    (the TCP listener takes 4 MiB).
// Figures: docs/results/test_suite.md, "Trust between daemons: what a
// caller can make the daemon spend".
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/cpp/hsap_client.h"
#include "common/auth_token.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "peer-resource-token-0123456789abcdef";

// A /proc/<pid>/status field in KiB ("VmRSS:", "VmHWM:"); -1 if absent.
int64_t StatusKiB(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(field.size()));
  }
  return -1;
}

// CPU seconds (utime + stime) of `pid`, all threads.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(all.substr(close + 2));
  std::string f;
  double ticks = 0;
  for (int i = 0; i < 13 && rest >> f; ++i) {
    if (i == 11 || i == 12) ticks += std::stod(f);  // utime, stime
  }
  return ticks / sysconf(_SC_CLK_TCK);
}

// The number of fds `pid` holds (-1 when unreadable).
int CountFds(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// A channel of its own (its own connection: no subchannel shared with
// other channels of this process to the same target).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target, const std::string& token = "",
                                          int max_send_bytes = -1) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxSendMessageSize(max_send_bytes);
  return CreateChannelWithToken(target, token, args);
}

grpc::Status Health(const std::shared_ptr<grpc::Channel>& channel,
                    grpc::health::v1::HealthCheckResponse::ServingStatus* status) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status st = grpc::health::v1::Health::NewStub(channel)
                              ->Check(&ctx, {}, &response);
  *status = response.status();
  return st;
}

void ExpectServing(const std::shared_ptr<grpc::Channel>& channel, const std::string& what) {
  grpc::health::v1::HealthCheckResponse::ServingStatus status = {};
  const grpc::Status st = Health(channel, &status);
  ASSERT_TRUE(st.ok()) << what << ": " << st.error_code() << " " << st.error_message();
  EXPECT_EQ(status, grpc::health::v1::HealthCheckResponse::SERVING) << what;
}

// A two-rank group of one daemon, forward and backward, against the
// float64 reference.
void ExpectCorrectCall(const std::string& socket, const std::string& group, uint64_t seed) {
  GroupSpec spec;
  spec.group = group;
  spec.nodes = 1;
  spec.devices_per_node = 2;
  spec.sockets = {socket};
  spec.deadline_ms = 30000;
  auto r = RunGroup(MakeProblem({0, 40, 41, 100, 128}, true, seed), spec);
  ASSERT_TRUE(r.ok()) << group << ": " << r.status();
  EXPECT_LT(r->max_error, 1e-4) << group;
}

grpc::Status Probe(const std::shared_ptr<grpc::Channel>& channel, size_t bytes) {
  hsap::v1::ProbeLinkRequest req;
  req.set_payload(std::string(bytes, 'p'));
  hsap::v1::ProbeLinkResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return hsap::v1::Peer::NewStub(channel)->ProbeLink(&ctx, req, &resp);
}

class PeerResourceTest : public ::testing::Test {
 protected:
  std::unique_ptr<DaemonProcess> Start(std::vector<std::string> flags, int rlimit_nofile = 0) {
    log_ = absl::StrCat(dir_.path(), "/hsapd.log");
    flags.insert(flags.begin(), {"--devices=cpu:2", "--cpu_threads=2"});
    auto p = DaemonProcess::Start(Runfile("server/hsapd"), flags, log_, rlimit_nofile);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? std::move(p).value() : nullptr;
  }
  // A private token file (hsapd refuses one its group or others can read).
  std::string TokenFile() {
    const std::string path = absl::StrCat(dir_.path(), "/token");
    std::ofstream(path) << kToken << "\n";
    chmod(path.c_str(), 0600);
    return path;
  }
  TempDir dir_;
  std::string log_;
};

// ---------------------------------------------------------------------------
// (a) 12 concurrent 60 MiB probes without the token.

// 12 clients at once, each a 60 MiB Peer.ProbeLink without credentials, to
// the daemon `pid` listening on `tcp`; every call must be UNAUTHENTICATED
// with a message holding `says`, and the daemon's peak RSS must grow by
// less than 16 MiB. Prints the codes, the refusal times and the RSS.
void ExpectFloodRefusedCheaply(pid_t pid, const std::string& tcp, const std::string& says) {
  const int64_t rss_before = StatusKiB(pid, "VmRSS:");
  const int64_t hwm_before = StatusKiB(pid, "VmHWM:");
  ASSERT_GT(hwm_before, 0);

  constexpr int kClients = 12;
  constexpr size_t kPayload = size_t{60} << 20;
  hsap::v1::ProbeLinkRequest flood;
  flood.set_payload(std::string(kPayload, 'f'));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < kClients; ++i) {
    channels.push_back(OwnChannel(tcp, "", 128 << 20));
    ASSERT_TRUE(channels.back()->WaitForConnected(std::chrono::system_clock::now() +
                                                  std::chrono::seconds(5)))
        << "client " << i;
  }
  std::vector<grpc::Status> statuses(kClients);
  std::vector<double> seconds(kClients);
  std::atomic<bool> sampling{true};
  int64_t rss_peak = rss_before;
  std::thread sampler([&] {
    while (sampling) {
      rss_peak = std::max(rss_peak, StatusKiB(pid, "VmRSS:"));
      absl::SleepFor(absl::Milliseconds(2));
    }
  });
  std::vector<std::thread> clients;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto stub = hsap::v1::Peer::NewStub(channels[i]);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      hsap::v1::ProbeLinkResponse resp;
      const absl::Time t0 = absl::Now();
      statuses[i] = stub->ProbeLink(&ctx, flood, &resp);
      seconds[i] = absl::ToDoubleSeconds(absl::Now() - t0);
    });
  }
  for (std::thread& t : clients) t.join();
  const double all_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  absl::SleepFor(absl::Milliseconds(100));
  sampling = false;
  sampler.join();
  const int64_t hwm_after = StatusKiB(pid, "VmHWM:");
  const int64_t rss_after = StatusKiB(pid, "VmRSS:");

  std::map<int, int> codes;
  std::map<int, std::string> messages;  // the first message of each code
  for (const grpc::Status& s : statuses) {
    ++codes[s.error_code()];
    messages.emplace(s.error_code(), s.error_message());
  }
  std::vector<std::string> seen;
  for (const auto& [code, n] : codes) {
    seen.push_back(absl::StrCat("code ", code, " x", n, " (", messages[code], ")"));
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  std::printf("unauthenticated flood: %d x %zu MiB ProbeLink without credentials: %s\n", kClients,
              kPayload >> 20, absl::StrJoin(seen, ", ").c_str());
  std::printf("  refusal times: min %.3f s, median %.3f s, max %.3f s; all %d in %.3f s\n",
              sorted.front(), sorted[kClients / 2], sorted.back(), kClients, all_seconds);
  std::printf("  daemon VmRSS before %.1f MiB, sampled peak %.1f MiB, after %.1f MiB; VmHWM "
              "%.1f -> %.1f MiB\n",
              rss_before / 1024.0, rss_peak / 1024.0, rss_after / 1024.0, hwm_before / 1024.0,
              hwm_after / 1024.0);
  // Every call is refused at its headers by the listener's gate, with the
  // handlers' message; its body is never read.
  for (int i = 0; i < kClients; ++i) {
    const grpc::Status& s = statuses[i];
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "client " << i << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(says)) << "client " << i;
    EXPECT_LT(seconds[i], 10.0) << "client " << i;
  }
  // A few connections' buffers at most. Without the gate (a 16 MiB memory
  // quota, the token checked by the handler after the whole message) the
  // peak grew by 24-83 MiB on the 2-core test VM, and by 300 MiB and more
  // without the quota.
  EXPECT_LT(hwm_after - hwm_before, 16 * 1024) << "peak RSS grew by " << (hwm_after - hwm_before)
                                               << " KiB";
  EXPECT_LT(rss_peak - rss_before, 16 * 1024);
}

TEST_F(PeerResourceTest, AnUnauthenticatedFloodCostsLittleAndIsRefused) {
  const int port = FreePort();
  auto d = Start({absl::StrCat("--port=", port), "--token_file=" + TokenFile(),
                  "--ucx_transports=tcp"});
  ASSERT_NE(d, nullptr);
  const std::string tcp = absl::StrCat("127.0.0.1:", port);
  // The TCP listener answers, and the check on it is live: a small probe
  // without the token is UNAUTHENTICATED; with the token it is served.
  ExpectServing(OwnChannel(tcp), "TCP health before");
  {
    const grpc::Status none = Probe(OwnChannel(tcp), 1 << 20);
    EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
    EXPECT_THAT(none.error_message(), HasSubstr("authorization: Bearer"));
    const grpc::Status with = Probe(OwnChannel(tcp, kToken), 3 << 20);
    EXPECT_TRUE(with.ok()) << with.error_code() << " " << with.error_message();
  }
  ExpectFloodRefusedCheaply(d->pid(), tcp, "authorization: Bearer");

  // Afterwards: health on a new connection, an authenticated peer call,
  // and a correct group call.
  ExpectServing(OwnChannel(tcp), "TCP health after the flood");
  const grpc::Status with = Probe(OwnChannel(tcp, kToken), 3 << 20);
  EXPECT_TRUE(with.ok()) << with.error_code() << " " << with.error_message();
  ExpectCorrectCall(d->socket(), "after-flood", 1);
}

// Neither TLS nor a token nor --insecure_peers: the port refuses every peer
// call, at its headers too; operator calls (here health) stay open.
TEST_F(PeerResourceTest, APeerFloodAtADaemonThatTakesNoPeersCostsLittle) {
  const int port = FreePort();
  auto d = Start({absl::StrCat("--port=", port), "--ucx_transports=tcp"});
  ASSERT_NE(d, nullptr);
  const std::string tcp = absl::StrCat("127.0.0.1:", port);
  ExpectServing(OwnChannel(tcp), "TCP health before");
  ExpectFloodRefusedCheaply(d->pid(), tcp, "takes no peer calls over TCP");
  ExpectServing(OwnChannel(tcp), "TCP health after the flood");
  ExpectCorrectCall(d->socket(), "after-peer-flood", 2);
}

// ---------------------------------------------------------------------------
// (b) The open-file limit.

TEST_F(PeerResourceTest, AtTheOpenFileLimitSessionsAreRefusedByNameAndHealthServes) {
  constexpr int kOpenFiles = 256;
  // daemon.cc's rule: 64 fds plus a sixteenth of the limit for gRPC,
  // health and metrics; half of the rest for sessions, 2 fds each.
  constexpr int kSessionCap = (kOpenFiles - 64 - kOpenFiles / 16) / 2 / 2;
  static_assert(kSessionCap == 44);
  const int port = FreePort();
  auto d = Start({absl::StrCat("--port=", port), "--insecure_peers"}, kOpenFiles);
  ASSERT_NE(d, nullptr);
  EXPECT_THAT(d->ReadLog(), HasSubstr(absl::StrCat("open-file limit ", kOpenFiles,
                                                   ": caps lowered to ", kSessionCap,
                                                   " sessions (--max_sessions 256)")));
  const std::string unix_target = "unix:" + d->socket();
  const std::string tcp = absl::StrCat("127.0.0.1:", port);
  auto old_unix = OwnChannel(unix_target);
  auto old_tcp = OwnChannel(tcp);
  ExpectServing(old_unix, "Unix socket health before");
  ExpectServing(old_tcp, "TCP health before");

  std::vector<std::unique_ptr<client::Client>> sessions;
  absl::Status refused;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 4 * kOpenFiles; ++i) {
    auto c = client::Client::Connect(d->socket());
    if (!c.ok()) {
      refused = c.status();
      break;
    }
    sessions.push_back(std::move(c).value());
  }
  const int fds_at_cap = CountFds(d->pid());
  std::printf("RLIMIT_NOFILE %d: %zu sessions open in %s, then: %s; the daemon holds %d fds\n",
              kOpenFiles, sessions.size(), absl::FormatDuration(absl::Now() - start).c_str(),
              refused.ToString().c_str(), fds_at_cap);
  // The sessions left gRPC its reserve (64 + a sixteenth of the limit).
  EXPECT_LT(fds_at_cap, kOpenFiles - 64 - kOpenFiles / 16);
  EXPECT_EQ(sessions.size(), static_cast<size_t>(kSessionCap));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr(absl::StrCat("the daemon already has ", kSessionCap,
                                     " open sessions, the limit (--max_sessions)")));
  // The sessions hold fds, and gRPC still has its own: health answers on
  // the connections it had and on new ones, over both listeners.
  ExpectServing(old_unix, "Unix socket health, existing connection, at the cap");
  ExpectServing(old_tcp, "TCP health, existing connection, at the cap");
  for (int i = 0; i < 8; ++i) {
    ExpectServing(OwnChannel(unix_target), absl::StrCat("Unix socket health, new connection ", i));
    ExpectServing(OwnChannel(tcp), absl::StrCat("TCP health, new connection ", i));
  }
  // An existing session still registers memory at the cap.
  auto buffer = sessions.front()->CreateBuffer(1 << 20, "at-the-cap");
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  buffer = absl::UnknownError("released");
  sessions.clear();
  // The daemon ends closed sessions asynchronously: a new group of two
  // ranks gets its sessions within a second.
  const absl::Time closed = absl::Now();
  while (absl::Now() - closed < absl::Seconds(5)) {
    auto probe = client::Client::Connect(d->socket());
    if (probe.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ExpectCorrectCall(d->socket(), "after-the-cap", 2);
}

// ---------------------------------------------------------------------------
// (c) Compiles whose caller gave up.

// 2^20 one-token documents on 16 x 8 ranks, auto strategy: many seconds
// of compiling on this machine (the balanced dispatch and five candidate
// plans).
hsap::v1::PlanSpec HugeSpec() {
  hsap::v1::PlanSpec spec;
  const int64_t tokens = int64_t{1} << 20;
  for (int64_t t = 0; t <= tokens; ++t) spec.add_cu_seqlens(t);
  spec.set_total_tokens(tokens);
  spec.set_causal(true);
  spec.mutable_topology()->set_num_nodes(16);
  spec.mutable_topology()->set_devices_per_node(8);
  spec.mutable_shape()->set_num_heads_q(8);
  spec.mutable_shape()->set_num_heads_kv(2);
  spec.mutable_shape()->set_head_dim(64);
  spec.mutable_shape()->set_dtype(hsap::v1::DTYPE_BFLOAT16);
  spec.set_strategy(hsap::v1::STRATEGY_AUTO);
  return spec;
}

enum class Method { kCompilePlan, kDispatch };
enum class GiveUp { kDeadline, kCancel };

struct Abandoned {
  grpc::Status status;
  double client_seconds = 0;  // from the request to the client's error
  double cpu_before = 0;      // the daemon's CPU from the request to the give-up
  double cpu_half = 0;        // ... from the give-up to 0.5 s after it
  double cpu_after = 0;       // ... over the following second
};

// Calls `method` with HugeSpec() over the Unix socket and gives up after
// `give_up_after` (a deadline, or TryCancel); measures the daemon's CPU
// from the request to 0.5 s past that moment, then over one more second.
Abandoned Abandon(hsap::v1::Plans::Stub* plans, pid_t daemon, Method method, GiveUp how,
                  absl::Duration give_up_after) {
  static const hsap::v1::PlanSpec* const kSpec = new hsap::v1::PlanSpec(HugeSpec());
  hsap::v1::CompilePlanRequest compile;
  *compile.mutable_spec() = *kSpec;
  compile.set_skip_cache(true);
  hsap::v1::DispatchRequest dispatch;
  *dispatch.mutable_spec() = *kSpec;
  Abandoned out;
  grpc::ClientContext ctx;
  const double cpu0 = CpuSeconds(daemon);
  const absl::Time start = absl::Now();
  ctx.set_deadline(absl::ToChronoTime(
      start + (how == GiveUp::kDeadline ? give_up_after : absl::Seconds(60))));
  std::thread call([&] {
    if (method == Method::kCompilePlan) {
      hsap::v1::CompilePlanResponse resp;
      out.status = plans->CompilePlan(&ctx, compile, &resp);
    } else {
      hsap::v1::DispatchResponse resp;
      out.status = plans->Dispatch(&ctx, dispatch, &resp);
    }
    out.client_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  });
  absl::SleepFor(start + give_up_after - absl::Now());
  const double cpu_give_up = CpuSeconds(daemon);
  if (how == GiveUp::kCancel) ctx.TryCancel();
  call.join();
  absl::SleepFor(start + give_up_after + absl::Milliseconds(500) - absl::Now());
  const double cpu1 = CpuSeconds(daemon);
  absl::SleepFor(absl::Seconds(1));
  out.cpu_before = cpu_give_up - cpu0;
  out.cpu_half = cpu1 - cpu_give_up;
  out.cpu_after = CpuSeconds(daemon) - cpu1;
  return out;
}

TEST_F(PeerResourceTest, AbandonedCompilesStopWithinHalfASecond) {
  auto d = Start({});
  ASSERT_NE(d, nullptr);
  auto plans = hsap::v1::Plans::NewStub(OwnChannel("unix:" + d->socket()));
  auto cache_stats = [&] {
    grpc::ClientContext ctx;
    hsap::v1::GetPlanCacheStatsResponse resp;
    EXPECT_TRUE(plans->GetPlanCacheStats(&ctx, {}, &resp).ok());
    return resp.stats();
  };
  // The idle daemon's CPU over a second: the floor of the windows below.
  const double idle0 = CpuSeconds(d->pid());
  absl::SleepFor(absl::Seconds(1));
  const double idle = CpuSeconds(d->pid()) - idle0;

  // Control: the same compile with a 2 s deadline keeps the daemon busy
  // over [0.7 s, 1.7 s] (this window is the one the cases below measure).
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    hsap::v1::CompilePlanRequest req;
    *req.mutable_spec() = HugeSpec();
    req.set_skip_cache(true);
    double busy = 0;
    std::thread sample([&] {
      absl::SleepFor(absl::Milliseconds(700));
      const double a = CpuSeconds(d->pid());
      absl::SleepFor(absl::Seconds(1));
      busy = CpuSeconds(d->pid()) - a;
    });
    hsap::v1::CompilePlanResponse resp;
    const absl::Time start = absl::Now();
    const grpc::Status st = plans->CompilePlan(&ctx, req, &resp);
    sample.join();
    // Past the deadline the compile is further on (dispatch, candidates).
    absl::SleepFor(start + absl::Milliseconds(2500) - absl::Now());
    const double late0 = CpuSeconds(d->pid());
    absl::SleepFor(absl::Seconds(1));
    const double late = CpuSeconds(d->pid()) - late0;
    std::printf("control: CompilePlan with a 2 s deadline: code %d; the daemon's CPU over "
                "[0.7, 1.7] s: %.2f s (idle: %.2f s per second), over [2.5, 3.5] s: %.2f s\n",
                st.error_code(), busy, idle, late);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
    EXPECT_GT(busy, 0.5) << "the compile is not long enough for the checks below to mean anything";
  }

  struct Case {
    const char* name;
    Method method;
    GiveUp how;
    grpc::StatusCode code;
  };
  const Case cases[] = {
      {"CompilePlan, deadline 200 ms", Method::kCompilePlan, GiveUp::kDeadline,
       grpc::StatusCode::DEADLINE_EXCEEDED},
      {"CompilePlan, cancelled at 200 ms", Method::kCompilePlan, GiveUp::kCancel,
       grpc::StatusCode::CANCELLED},
      {"Dispatch, deadline 200 ms", Method::kDispatch, GiveUp::kDeadline,
       grpc::StatusCode::DEADLINE_EXCEEDED},
      {"Dispatch, cancelled at 200 ms", Method::kDispatch, GiveUp::kCancel,
       grpc::StatusCode::CANCELLED},
  };
  for (const Case& c : cases) {
    const auto before = cache_stats();
    const Abandoned a = Abandon(plans.get(), d->pid(), c.method, c.how, absl::Milliseconds(200));
    const auto after = cache_stats();
    std::printf("%-32s: code %d after %.3f s; daemon CPU %.2f s before giving up, %.2f s in the "
                "0.5 s after, %.2f s in the second after that\n",
                c.name, a.status.error_code(), a.client_seconds, a.cpu_before, a.cpu_half,
                a.cpu_after);
    EXPECT_EQ(a.status.error_code(), c.code) << c.name << ": " << a.status.error_message();
    EXPECT_LT(a.client_seconds, 0.5) << c.name;
    // The daemon was compiling when the client gave up, and stopped within
    // 0.5 s.
    EXPECT_GT(a.cpu_before + a.cpu_half, 0.1) << c.name;
    EXPECT_LE(a.cpu_after, idle + 0.03) << c.name << ": the daemon kept compiling";
    if (c.method == Method::kDispatch) {
      // The cached path compiled (a miss) and cached nothing.
      EXPECT_EQ(after.misses(), before.misses() + 1) << c.name;
      EXPECT_EQ(after.entries(), before.entries()) << c.name;
    }
  }
  ExpectCorrectCall(d->socket(), "after-the-compiles", 3);
}

}  // namespace
}  // namespace hsap::testing

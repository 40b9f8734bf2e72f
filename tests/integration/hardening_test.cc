// Issue 14 against real hsapd processes, one test per way a local client or
// a peer used to crash, wedge, starve or poison the daemon: a region shrunk
// under a call (SIGBUS), garbage UCX addresses in Peer.Join (an abort inside
// UCX), a client that floods the session socket without reading, the fd
// limit, one session taking every shared resource, group state outliving
// its sessions, and idle /metrics clients. Each test then checks that the
// daemon is alive and still serves a correct call.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "common/fd_passing.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hsap/v1/peer.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "server/metrics/test_util.h"
#include "tests/integration/group_call.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/raw_daemon_io.h"
#include "tests/integration/test_daemon.h"

namespace hsap::hardening {
namespace {

using ::testing::HasSubstr;
using Code = absl::StatusCode;
using metrics::testing::SampleValue;
using metrics::testing::ScrapeMetrics;

constexpr int64_t kTokens = 64, kHq = 4, kHkv = 2, kD = 32;
const std::vector<int64_t> kCu = {0, 10, 10, 40, kTokens};
constexpr int64_t kArea = 10 * 11 / 2 + 30 * 31 / 2 + 24 * 25 / 2;

std::unique_ptr<testing::DaemonProcess> StartDaemon(std::vector<std::string> flags) {
  flags.push_back("--cpu_threads=1");
  auto d = testing::DaemonProcess::Start(testing::Runfile("server/hsapd"), flags);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(d).value() : nullptr;
}

bool Alive(const testing::DaemonProcess& d) { return waitpid(d.pid(), nullptr, WNOHANG) == 0; }

hsap::v1::CallId OneRank(const std::string& group, uint64_t seq = 1) {
  hsap::v1::CallId id;
  id.set_group(group);
  id.set_group_size(1);
  id.set_call_seq(seq);
  return id;
}

// A fresh client runs a good one-rank forward call: OK with the mask's area.
void ExpectGoodCall(const std::string& socket, const std::string& group) {
  auto c = client::Client::Connect(socket);
  ASSERT_TRUE(c.ok()) << c.status();
  auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32},
                                            "good-" + group);
  ASSERT_TRUE(b.ok()) << b.status();
  (*b)->FillInputs(11);
  auto r = (*c)->Forward((*b)->ForwardRequest(OneRank(group), client::DocumentMask(kCu, true), {}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats().area(), kArea);
}

// Waits (10 s at most) until `series` reads `value` on the daemon's /metrics.
bool WaitMetric(int port, const std::string& series, double value) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto text = ScrapeMetrics(port);
    if (text.ok() && SampleValue(*text, series) == value) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

// ---------------------------------------------------------------------------
// 1. A region shrunk under a call ends that call, never the daemon.

TEST(HardeningTest, AShrunkRegionEndsTheCallNotTheDaemon) {
  auto d = StartDaemon({"--devices=cpu:1"});
  ASSERT_NE(d, nullptr);
  auto c = client::Client::Connect(d->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  auto buf = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32},
                                              "memfd");
  ASSERT_TRUE(buf.ok()) << buf.status();
  (*buf)->FillInputs(3);

  // memfds: the daemon seals them, so the client cannot shrink them.
  {
    UniqueFd fd(memfd_create("hsap-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(fd.get(), 8192), 0);
    ASSERT_TRUE((*c)->PassFd(fd.get(), 900).ok());
    hsap::v1::RegisterRegionRequest r;
    r.mutable_memfd()->set_transfer_id(900);
    r.set_size_bytes(8192);
    ASSERT_TRUE((*c)->RegisterRegion(r).ok());
    EXPECT_NE(ftruncate(fd.get(), 0), 0);
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(fcntl(fd.get(), F_GET_SEALS) & F_SEAL_SHRINK, 0);
  }
  // A POSIX shm object cannot be sealed: the same buffer as an shm region.
  const uint64_t size = (*buf)->buffer().size();
  const std::string name = absl::StrCat("/hsap-hardening-", getpid());
  shm_unlink(name.c_str());
  UniqueFd shm(shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  ASSERT_TRUE(shm.valid());
  ASSERT_EQ(ftruncate(shm.get(), size), 0);
  void* local = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, shm.get(), 0);
  ASSERT_NE(local, MAP_FAILED);
  std::memcpy(local, (*buf)->buffer().data(), size);
  munmap(local, size);
  hsap::v1::RegisterRegionRequest reg;
  reg.mutable_shm()->set_name(name);
  reg.set_size_bytes(size);
  auto shm_region = (*c)->RegisterRegion(reg);
  ASSERT_TRUE(shm_region.ok()) << shm_region.status();
  shm_unlink(name.c_str());  // the daemon's mapping and our fd keep it
  auto on_shm = [&](const std::string& group) {
    auto r = (*buf)->ForwardRequest(OneRank(group), client::DocumentMask(kCu, true), {});
    for (auto* t : {r.mutable_q(), r.mutable_k(), r.mutable_v(), r.mutable_o(), r.mutable_lse()}) {
      t->set_region_id(shm_region->region_id());
    }
    return (*c)->Forward(r);
  };
  auto first = on_shm("shm-1");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->stats().area(), kArea);

  // The client shrinks it to nothing; the next call touches it.
  ASSERT_EQ(ftruncate(shm.get(), 0), 0);
  auto shrunk = on_shm("shm-2");
  EXPECT_EQ(shrunk.status().code(), Code::kFailedPrecondition) << shrunk.status();
  EXPECT_THAT(std::string(shrunk.status().message()),
              HasSubstr(absl::StrCat("region ", shm_region->region_id(), " shrank while the daemon used it")));
  EXPECT_THAT(std::string(shrunk.status().message()),
              HasSubstr(absl::StrCat("registered with ", size, " bytes, it now holds 0 bytes")));
  ASSERT_TRUE(Alive(*d)) << "hsapd died of the shrunk region";
  // The region stays unusable until registered again.
  auto again = on_shm("shm-3");
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("unregister it and register"));
  EXPECT_TRUE((*c)->Unregister(shm_region->region_id()).ok());
  // A memfd created without MFD_ALLOW_SEALING is refused, saying how.
  {
    UniqueFd fd(memfd_create("hsap-unsealable", MFD_CLOEXEC));
    ASSERT_EQ(ftruncate(fd.get(), 4096), 0);
    ASSERT_TRUE((*c)->PassFd(fd.get(), 901).ok());
    hsap::v1::RegisterRegionRequest r;
    r.mutable_memfd()->set_transfer_id(901);
    r.set_size_bytes(4096);
    auto st = (*c)->RegisterRegion(r);
    EXPECT_EQ(st.status().code(), Code::kFailedPrecondition);
    EXPECT_THAT(std::string(st.status().message()), HasSubstr("MFD_ALLOW_SEALING"));
  }
  auto good = (*c)->Forward((*buf)->ForwardRequest(OneRank("memfd"), client::DocumentMask(kCu, true), {}));
  ASSERT_TRUE(good.ok()) << good.status();
  ExpectGoodCall(d->socket(), "after-sigbus");
  EXPECT_TRUE(Alive(*d));
}

// ---------------------------------------------------------------------------
// 2. Peer input is validated before UCX sees it.

TEST(HardeningTest, GarbagePeerJoinsAreRefusedAndTheClusterServes) {
  auto cluster = testing::LocalCluster::Start(2, 1, {"--ucx_transports=tcp"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_TRUE((*cluster)->WaitFormed(absl::Seconds(30)).ok());
  auto stub = hsap::v1::Peer::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*cluster)->port(0)), grpc::InsecureChannelCredentials()));
  std::mt19937 rng(14);
  std::string random_64k(64 << 10, '\0');
  for (char& ch : random_64k) ch = static_cast<char>(rng());
  struct Case {
    std::string address;
    std::string text;
  };
  const Case cases[] = {
      {std::string(8, '\xff'), "ucx_worker_address has format version 15"},
      {random_64k, "ucx_worker_address has 65536 bytes"},
      {std::string("\x20", 1) + std::string(40, '\x01'), "ucx_worker_address"},
      {"", "ucx_worker_address is empty"},
  };
  for (const Case& k : cases) {
    hsap::v1::JoinRequest join;
    join.set_node_rank(1);
    join.set_num_nodes(2);
    join.set_devices_per_node(1);
    join.set_incarnation(77);
    join.set_version("attacker");
    join.set_ucx_worker_address(k.address);
    hsap::v1::JoinResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = stub->Join(&ctx, join, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.text << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(k.text));
    ASSERT_TRUE(Alive(*(*cluster)->node(0))) << "node 0 died at " << k.text;
  }
  EXPECT_TRUE((*cluster)->WaitFormed(absl::Seconds(10)).ok());
  // A cross-node call is correct afterwards.
  const testing::GlobalProblem p = testing::MakeProblem({0, 40, 64}, true, 5);
  testing::GroupSpec spec;
  spec.group = "after-garbage";
  spec.nodes = 2;
  spec.devices_per_node = 1;
  spec.sockets = (*cluster)->sockets();
  auto result = testing::RunGroup(p, spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(result->max_error, 1e-4);
}

// ---------------------------------------------------------------------------
// 3. The session socket serves everybody, whatever one client does.

// CPU seconds the process has used (utime + stime).
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(f);
  }
  return ticks / sysconf(_SC_CLK_TCK);
}

// The lowest fd number `pid` does not use.
int LowestFreeFd(pid_t pid) {
  std::vector<bool> used(1 << 16);
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd >= 0 && fd < static_cast<int>(used.size())) used[fd] = true;
  }
  closedir(d);
  int n = 0;
  while (n < static_cast<int>(used.size()) && used[n]) ++n;
  return n;
}

int RawConnect(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, (socket + ".session").c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(HardeningTest, AFloodingClientAndTheFdLimitWedgeNobody) {
  auto d = StartDaemon({"--devices=cpu:1"});
  ASSERT_NE(d, nullptr);
  // The flooder: transfers without ever reading an ack.
  UniqueFd flooder(RawConnect(d->socket()));
  char hello[4096];
  ASSERT_GT(recv(flooder.get(), hello, sizeof(hello), 0), 0);
  UniqueFd mfd(memfd_create("hsap-flood", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(mfd.get(), 4096), 0);
  int sent = 0;
  for (uint64_t id = 1; id <= 3000; ++id) {
    const std::string m = testing::TransferMessage(id);
    if (SendWithFds(flooder.get(), m, {mfd.get()}, MSG_DONTWAIT | MSG_NOSIGNAL) <= 0) break;
    ++sent;
  }
  std::printf("the flooder sent %d transfers before its socket filled\n", sent);
  EXPECT_GT(sent, 200);
  // Meanwhile every other client connects and registers at once.
  std::vector<std::unique_ptr<client::Client>> others;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    auto c = client::Client::Connect(d->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    auto b = (*c)->CreateBuffer(4096, absl::StrCat("other-", i));
    ASSERT_TRUE(b.ok()) << b.status();
    // Served at once, not after the flood (loose: a loaded, sanitized CI run).
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "client " << i;
    others.push_back(std::move(c).value());
  }
  ExpectGoodCall(d->socket(), "beside-the-flooder");
  auto calls = client::AttentionBuffers::Create(others[1].get(), {kTokens, kHq, kHkv, kD, DType::kFloat32},
                                                "at-limit");
  ASSERT_TRUE(calls.ok()) << calls.status();
  (*calls)->FillInputs(8);

  // The fd limit: no fd left for the daemon. RLIMIT_NOFILE bounds fd
  // numbers, so the limit is set to the lowest free number.
  const int lowest_free = LowestFreeFd(d->pid());
  ASSERT_GT(lowest_free, 2);
  struct rlimit before, at_limit;
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, nullptr, &before), 0);
  at_limit = before;
  at_limit.rlim_cur = lowest_free;
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, &at_limit, nullptr), 0);
  UniqueFd waiting(RawConnect(d->socket()));  // queued in the backlog
  const double cpu_before = CpuSeconds(d->pid());
  const absl::Time t0 = absl::Now();
  pollfd p = {waiting.get(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 1500), 0) << "a hello came although the daemon has no fd left";
  const double cpu = CpuSeconds(d->pid()) - cpu_before;
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  std::printf("at the fd limit: daemon used %.2f s of CPU in %.2f s (no busy loop)\n", cpu, wall);
  EXPECT_LT(cpu, 0.3 * wall);
  // Existing sessions keep working: a passed fd is refused politely, calls run.
  {
    UniqueFd fd(memfd_create("hsap-at-limit", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    const absl::Status st = others[0]->PassFd(fd.get(), 77);
    EXPECT_EQ(st.code(), Code::kResourceExhausted) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("open-file limit"));
  }
  auto at_limit_call = others[1]->Forward(
      (*calls)->ForwardRequest(OneRank("at-the-limit"), client::DocumentMask(kCu, true), {}));
  EXPECT_TRUE(at_limit_call.ok()) << at_limit_call.status();
  if (at_limit_call.ok()) {
    EXPECT_EQ(at_limit_call->stats().area(), kArea);
  }
  ASSERT_TRUE(Alive(*d));
  ASSERT_EQ(prlimit(d->pid(), RLIMIT_NOFILE, &before, nullptr), 0);
  // The waiting client is served once fds are back (the backoff is <= 1 s).
  EXPECT_EQ(poll(&p, 1, 5000), 1);
  {
    UniqueFd fd(memfd_create("hsap-after-limit", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    EXPECT_TRUE(others[0]->PassFd(fd.get(), 78).ok());
  }
  ExpectGoodCall(d->socket(), "after-the-fd-limit");
}

// ---------------------------------------------------------------------------
// 4. Caps: no session takes what the others need; each refusal names its flag.

TEST(HardeningTest, CapsKeepASessionFromStarvingTheOthers) {
  const int metrics_port = testing::FreePort();
  auto d = StartDaemon({"--devices=cpu:1", absl::StrCat("--metrics_port=", metrics_port),
                        "--max_sessions=4", "--max_regions_per_session=3", "--max_regions=5"});
  ASSERT_NE(d, nullptr);
  auto a = client::Client::Connect(d->socket());
  auto b = client::Client::Connect(d->socket());
  ASSERT_TRUE(a.ok() && b.ok());
  // One session asks for a sparse 1 TiB memfd: its own share is 256 GiB.
  auto huge = (*a)->CreateBuffer(uint64_t{1} << 40, "sparse-1TiB");
  EXPECT_EQ(huge.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("--max_region_bytes_per_session"));
  auto b1 = (*b)->CreateBuffer(1 << 20, "b1");  // the others are not starved
  ASSERT_TRUE(b1.ok()) << b1.status();
  std::vector<std::unique_ptr<client::SharedBuffer>> held;
  for (int i = 0; i < 3; ++i) {
    auto r = (*a)->CreateBuffer(4096, "a");
    ASSERT_TRUE(r.ok()) << r.status();
    held.push_back(std::move(r).value());
  }
  auto a4 = (*a)->CreateBuffer(4096, "a4");
  EXPECT_EQ(a4.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(std::string(a4.status().message()), HasSubstr("--max_regions_per_session"));
  auto c = client::Client::Connect(d->socket());
  ASSERT_TRUE(c.ok());
  auto c1 = (*c)->CreateBuffer(4096, "c1");
  ASSERT_TRUE(c1.ok()) << c1.status();  // region 5 of 5
  auto c2 = (*c)->CreateBuffer(4096, "c2");
  EXPECT_EQ(c2.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(std::string(c2.status().message()), HasSubstr("--max_regions)"));
  auto d4 = client::Client::Connect(d->socket());
  ASSERT_TRUE(d4.ok());
  auto e = client::Client::Connect(d->socket());
  EXPECT_EQ(e.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("--max_sessions"));
  // Every cap is a metric, and so are its refusals.
  auto text = ScrapeMetrics(metrics_port);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(SampleValue(*text, "hsap_limit{limit=\"max_sessions\"}"), 4);
  EXPECT_EQ(SampleValue(*text, "hsap_limit{limit=\"max_region_bytes_per_session\"}"), 274877906944.0);
  EXPECT_EQ(SampleValue(*text, "hsap_limit_refusals_total{limit=\"max_sessions\"}"), 1);
  EXPECT_EQ(SampleValue(*text, "hsap_limit_refusals_total{limit=\"max_region_bytes_per_session\"}"), 1);
  EXPECT_EQ(SampleValue(*text, "hsap_limit_refusals_total{limit=\"max_regions_per_session\"}"), 1);
  EXPECT_EQ(SampleValue(*text, "hsap_limit_refusals_total{limit=\"max_regions\"}"), 1);
  EXPECT_GT(SampleValue(*text, "hsap_limit{limit=\"max_region_mappings\"}"), 1000);
  EXPECT_EQ(SampleValue(*text, "hsap_limit{limit=\"max_message_bytes\"}"), 64 << 20);
  EXPECT_EQ(SampleValue(*text, "hsap_limit{limit=\"max_tcp_message_bytes\"}"), 4 << 20);
  // Closing a session gives its share back: a good call from a new session.
  a->reset();
  held.clear();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  absl::Status good = absl::UnknownError("");
  while (absl::Now() < deadline) {
    auto g = client::Client::Connect(d->socket());
    if (g.ok()) {
      auto bufs = client::AttentionBuffers::Create(g->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "g");
      if (bufs.ok()) {
        (*bufs)->FillInputs(1);
        auto r = (*g)->Forward((*bufs)->ForwardRequest(OneRank("caps"), client::DocumentMask(kCu, true), {}));
        good = r.status();
        if (r.ok()) {
          EXPECT_EQ(r->stats().area(), kArea);
        }
        break;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(good.ok()) << good;
}

TEST(HardeningTest, TheMappingCapKeepsHeadroom) {
  auto d = StartDaemon({"--devices=cpu:1", "--max_region_mappings=3"});
  ASSERT_NE(d, nullptr);
  auto c = client::Client::Connect(d->socket());
  ASSERT_TRUE(c.ok());
  auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "m");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*c)->CreateBuffer(4096, "m2").ok());
  ASSERT_TRUE((*c)->CreateBuffer(4096, "m3").ok());
  auto m4 = (*c)->CreateBuffer(4096, "m4");
  EXPECT_EQ(m4.status().code(), Code::kResourceExhausted);
  EXPECT_THAT(std::string(m4.status().message()), HasSubstr("--max_region_mappings"));
  EXPECT_THAT(std::string(m4.status().message()), HasSubstr("vm.max_map_count"));
  (*b)->FillInputs(2);
  auto r = (*c)->Forward((*b)->ForwardRequest(OneRank("mappings"), client::DocumentMask(kCu, true), {}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats().area(), kArea);
}

// Registration costs the same whatever other sessions hold (it used to grow
// with every region of every session: 0.3 ms alone, 3.1 ms beside 16,000).
TEST(HardeningTest, RegistrationCostIsIndependentOfOtherSessions) {
  auto d = StartDaemon({"--devices=cpu:1"});
  ASSERT_NE(d, nullptr);
  auto c = client::Client::Connect(d->socket());
  ASSERT_TRUE(c.ok());
  UniqueFd fd(memfd_create("hsap-cost", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(fd.get(), 4096), 0);
  uint64_t next_transfer = 1;
  // The median over rounds of 40 register+unregister pairs, in ms per pair.
  auto pair_ms = [&]() {
    std::vector<double> rounds;
    for (int round = 0; round < 5; ++round) {
      std::vector<uint64_t> transfers;
      for (int i = 0; i < 40; ++i) {
        EXPECT_TRUE((*c)->PassFd(fd.get(), next_transfer).ok());
        transfers.push_back(next_transfer++);
      }
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t t : transfers) {
        hsap::v1::RegisterRegionRequest r;
        r.mutable_memfd()->set_transfer_id(t);
        r.set_size_bytes(4096);
        auto id = (*c)->RegisterRegion(r);
        EXPECT_TRUE(id.ok()) << id.status();
        EXPECT_TRUE((*c)->Unregister(id->region_id()).ok());
      }
      rounds.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - start).count() / 40);
    }
    std::sort(rounds.begin(), rounds.end());
    return rounds[rounds.size() / 2];
  };
  const double alone = pair_ms();
  // 16 other sessions hold 1,000 regions each.
  std::vector<std::unique_ptr<client::Client>> others(16);
  std::vector<std::vector<std::unique_ptr<client::SharedBuffer>>> held(16);
  std::vector<std::thread> threads;
  for (int s = 0; s < 16; ++s) {
    threads.emplace_back([&, s] {
      auto o = client::Client::Connect(d->socket());
      if (!o.ok()) return;
      others[s] = std::move(o).value();
      for (int i = 0; i < 1000; ++i) {
        auto b = others[s]->CreateBuffer(4096, "held");
        if (!b.ok()) return;
        held[s].push_back(std::move(b).value());
      }
    });
  }
  for (auto& t : threads) t.join();
  size_t total = 0;
  for (auto& h : held) total += h.size();
  ASSERT_EQ(total, 16000u);
  const double crowded = pair_ms();
  std::printf("register+unregister: %.3f ms alone, %.3f ms beside 16,000 regions of 16 sessions "
              "(median of 5 rounds of 40; shared machine)\n", alone, crowded);
  EXPECT_LT(crowded, 2.5 * alone + 0.1);
  ExpectGoodCall(d->socket(), "after-16000-regions");
}

// ---------------------------------------------------------------------------
// 5. Group state belongs to the sessions that used it.

// Rank 0's token count in Plans.Dispatch's 2-rank layout of kCu (-1 on error).
int64_t RankZeroTokens(const std::string& socket) {
  auto plans = hsap::v1::Plans::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  hsap::v1::DispatchRequest req;
  auto* spec = req.mutable_spec();
  for (int64_t x : kCu) spec->add_cu_seqlens(x);
  spec->set_causal(true);
  spec->set_window(-1);
  spec->set_total_tokens(kTokens);
  spec->mutable_topology()->set_num_nodes(1);
  spec->mutable_topology()->set_devices_per_node(2);
  spec->mutable_shape()->set_num_heads_q(kHq);
  spec->mutable_shape()->set_num_heads_kv(kHkv);
  spec->mutable_shape()->set_head_dim(kD);
  spec->mutable_shape()->set_dtype(hsap::v1::DTYPE_FLOAT32);
  spec->set_profile("cpu-loopback");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  hsap::v1::DispatchResponse resp;
  if (!plans->Dispatch(&ctx, req, &resp).ok()) return -1;
  int64_t n = 0;
  for (const auto& range : resp.dispatch().ranks(0).ranges()) n += range.end() - range.begin();
  return n;
}

TEST(HardeningTest, GroupStateIsReleasedWithItsSessions) {
  const int metrics_port = testing::FreePort();
  auto d = StartDaemon({"--devices=cpu:2", absl::StrCat("--metrics_port=", metrics_port)});
  ASSERT_NE(d, nullptr);
  const testing::GlobalProblem p = testing::MakeProblem(kCu, true, 9);
  testing::GroupSpec spec;
  spec.nodes = 1;
  spec.devices_per_node = 2;
  spec.sockets = {d->socket()};
  {
    // A one-rank job used the name X and ended ...
    auto c = client::Client::Connect(d->socket());
    ASSERT_TRUE(c.ok());
    auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "x");
    ASSERT_TRUE(b.ok());
    (*b)->FillInputs(4);
    ASSERT_TRUE((*c)->Forward((*b)->ForwardRequest(OneRank("X"), client::DocumentMask(kCu, true), {})).ok());
  }
  ASSERT_TRUE(WaitMetric(metrics_port, "hsap_call_groups", 0));
  // ... so a 2-rank job may use it (it used to get "group 'X' has size 1").
  spec.group = "X";
  auto x = testing::RunGroup(p, spec);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_LT(x->max_error, 1e-4);

  // A session submits rank 0, call 1 of someone else's group Y and exits.
  {
    auto stray = client::Client::Connect(d->socket());
    ASSERT_TRUE(stray.ok());
    auto dispatch_tokens = RankZeroTokens(d->socket());
    ASSERT_GT(dispatch_tokens, 0);
    auto b = client::AttentionBuffers::Create(stray->get(), {dispatch_tokens, kHq, kHkv, kD, DType::kFloat32}, "stray");
    ASSERT_TRUE(b.ok());
    hsap::v1::CallId id;
    id.set_group("Y");
    id.set_group_size(2);
    id.set_rank(0);
    id.set_call_seq(1);
    hsap::v1::CallOptions o;
    o.set_deadline_ms(300);
    (void)(*stray)->Forward((*b)->ForwardRequest(id, client::DocumentMask(kCu, true), o));
  }
  ASSERT_TRUE(WaitMetric(metrics_port, "hsap_call_groups", 0));
  // The real job's rank 0 is not locked out ("last submitted 1" before).
  spec.group = "Y";
  auto y = testing::RunGroup(p, spec);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_LT(y->max_error, 1e-4);

  // 300 one-call groups leave nothing behind once their session closed.
  {
    auto c = client::Client::Connect(d->socket());
    ASSERT_TRUE(c.ok());
    auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "many");
    ASSERT_TRUE(b.ok());
    (*b)->FillInputs(5);
    for (int i = 0; i < 300; ++i) {
      ASSERT_TRUE((*c)->Forward((*b)->ForwardRequest(OneRank(absl::StrCat("one-", i)),
                                                     client::DocumentMask(kCu, true), {}))
                      .ok());
    }
    auto text = ScrapeMetrics(metrics_port);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(SampleValue(*text, "hsap_call_groups"), 300);
  }
  EXPECT_TRUE(WaitMetric(metrics_port, "hsap_call_groups", 0));

  // After the last call_seq there is no next one; the message says so.
  {
    auto c = client::Client::Connect(d->socket());
    ASSERT_TRUE(c.ok());
    auto b = client::AttentionBuffers::Create(c->get(), {kTokens, kHq, kHkv, kD, DType::kFloat32}, "wrap");
    ASSERT_TRUE(b.ok());
    (*b)->FillInputs(6);
    const uint64_t last = std::numeric_limits<uint64_t>::max();
    ASSERT_TRUE((*c)->Forward((*b)->ForwardRequest(OneRank("W", last), client::DocumentMask(kCu, true), {})).ok());
    // (0 is refused at the entry: sequences start at 1.)
    auto wrapped = (*c)->Forward((*b)->ForwardRequest(OneRank("W", 1), client::DocumentMask(kCu, true), {}));
    EXPECT_EQ(wrapped.status().code(), Code::kFailedPrecondition);
    EXPECT_THAT(std::string(wrapped.status().message()), HasSubstr("the last one there is"));
    EXPECT_THAT(std::string(wrapped.status().message()), ::testing::Not(HasSubstr("the next must be 0")));
  }
  ExpectGoodCall(d->socket(), "after-groups");
}

// ---------------------------------------------------------------------------
// 6. /metrics survives idle clients.

TEST(HardeningTest, IdleMetricsClientsDoNotBlockAScrape) {
  const int metrics_port = testing::FreePort();
  auto d = StartDaemon({"--devices=cpu:1", absl::StrCat("--metrics_port=", metrics_port)});
  ASSERT_NE(d, nullptr);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(metrics_port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const char half[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    ASSERT_GT(send(fd.get(), half, sizeof(half) - 1, MSG_NOSIGNAL), 0);
    idle.push_back(std::move(fd));
  }
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  auto text = ScrapeMetrics(metrics_port);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_GE(SampleValue(*text, "hsap_sessions"), 0);
  std::printf("a scrape behind 4 idle half-request clients took %s (more than 13 s before)\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(5));  // loose for a loaded CI run; the bug took > 13 s
  ExpectGoodCall(d->socket(), "after-idle-scrapers");
}

}  // namespace
}  // namespace hsap::hardening

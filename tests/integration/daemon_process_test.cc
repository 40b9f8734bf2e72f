// The real hsapd binary as a child process: a client that disconnects
// without unregistering leaves no mapping behind; health is SERVING while up
// and NOT_SERVING while draining; a drain lets the call in flight finish,
// refuses new ones, and exits 0; the kernels' scratch kept between calls
// stays within --kernel_scratch_cache_bytes, which /metrics reports, and a
// negative value is refused at start.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <future>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "common/workload.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "server/metrics/test_util.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using grpc::health::v1::HealthCheckResponse;

std::unique_ptr<testing::DaemonProcess> StartDaemon(std::vector<std::string> flags = {}) {
  flags.push_back("--cpu_threads=2");
  auto p = testing::DaemonProcess::Start(testing::Runfile("server/hsapd"), flags);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(p).value() : nullptr;
}

HealthCheckResponse::ServingStatus Health(const std::string& socket, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  return st.ok() ? resp.status() : HealthCheckResponse::UNKNOWN;
}

bool WaitFor(const std::function<bool()>& pred, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

TEST(DaemonProcessTest, DisconnectedClientLeavesNoMapping) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  {
    auto client = client::Client::Connect(daemon->socket());
    ASSERT_TRUE(client.ok()) << client.status();
    auto a = (*client)->CreateBuffer(1 << 20, "leak-check-a");
    auto b = (*client)->CreateBuffer(1 << 16, "leak-check-b");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NE(daemon->Maps().find("memfd:hsap-leak-check-a"), std::string::npos);
    EXPECT_NE(daemon->Maps().find("memfd:hsap-leak-check-b"), std::string::npos);
  }  // the client goes away without unregistering anything
  EXPECT_TRUE(WaitFor([&] { return daemon->Maps().find("memfd:hsap-leak-check") == std::string::npos; }, 5))
      << daemon->Maps();
  // A client killed outright (SIGKILL, no destructors) is reclaimed too.
  const pid_t child = fork();
  if (child == 0) {
    auto client = client::Client::Connect(daemon->socket());
    if (!client.ok()) _exit(1);
    auto c = (*client)->CreateBuffer(1 << 20, "leak-check-killed");
    if (!c.ok()) _exit(2);
    pause();  // until killed
    _exit(0);
  }
  ASSERT_TRUE(WaitFor([&] { return daemon->Maps().find("memfd:hsap-leak-check-killed") != std::string::npos; }, 10));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(WaitFor([&] { return daemon->Maps().find("memfd:hsap-leak-check-killed") == std::string::npos; }, 5));
  EXPECT_EQ(Health(daemon->socket(), ""), HealthCheckResponse::SERVING);
}

TEST(DaemonProcessTest, DrainReportsNotServingAndFinishesTheCallInFlight) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(Health(daemon->socket(), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(daemon->socket(), "hsap.v1.Attention"), HealthCheckResponse::SERVING);
  auto client = client::Client::Connect(daemon->socket());
  ASSERT_TRUE(client.ok());
  // One long bidirectional document: a call that takes a while on 2 cores,
  // but ends well within the 30 s drain timeout. Sanitized kernels run
  // 10-20x slower (--config=asan/tsan): a quarter of the tokens there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const int64_t tokens = 1024;
#else
  const int64_t tokens = 4096;
#endif
  auto b = client::AttentionBuffers::Create(client->get(), {tokens, 8, 8, 128, DType::kFloat32}, "drain");
  ASSERT_TRUE(b.ok()) << b.status();
  (*b)->FillInputs(1);
  hsap::v1::CallId call;
  call.set_group("drain");
  call.set_group_size(1);
  call.set_call_seq(1);
  const auto mask = client::DocumentMask({0, tokens}, false);
  auto in_flight = std::async(std::launch::async, [&] {
    return (*client)->Backward((*b)->BackwardRequest(call, mask, {}));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  daemon->Signal(SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return Health(daemon->socket(), "") == HealthCheckResponse::NOT_SERVING; }, 5));
  call.set_call_seq(2);
  auto refused = (*client)->Forward((*b)->ForwardRequest(call, mask, {}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  auto finished = in_flight.get();
  EXPECT_TRUE(finished.ok()) << finished.status();
  const int status = daemon->Wait(30);
  ASSERT_NE(status, -1) << "hsapd did not exit after draining";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A forward and a backward call whose packed K/V and partial results are
// blocks of more than 1 MiB: what they leave for the next call is at most
// the flag (the default, 64 MiB, or 0: nothing), and /metrics says so.
TEST(DaemonProcessTest, KernelScratchKeptBetweenCallsStaysWithinItsFlag) {
  for (const int64_t limit : {int64_t{-1}, int64_t{0}}) {  // -1: the default
    auto port = metrics::testing::PickFreeLoopbackPort();
    ASSERT_TRUE(port.ok()) << port.status();
    const int metrics_port = *port;
    std::vector<std::string> flags = {absl::StrCat("--metrics_port=", metrics_port)};
    if (limit >= 0) flags.push_back(absl::StrCat("--kernel_scratch_cache_bytes=", limit));
    auto daemon = StartDaemon(flags);
    ASSERT_NE(daemon, nullptr);
    const double expected_limit = limit >= 0 ? limit : 64 << 20;
    EXPECT_EQ(metrics::testing::ScrapeSample(metrics_port, "hsap_limit{limit=\"kernel_scratch_cache_bytes\"}"),
              expected_limit);
    EXPECT_EQ(metrics::testing::ScrapeSample(metrics_port, "hsap_kernel_scratch_cached_bytes"), 0);
    auto client = client::Client::Connect(daemon->socket());
    ASSERT_TRUE(client.ok()) << client.status();
    constexpr int64_t kTokens = 2048;
    auto b = client::AttentionBuffers::Create(client->get(), {kTokens, 4, 4, 64, DType::kFloat32},
                                              "scratch");
    ASSERT_TRUE(b.ok()) << b.status();
    (*b)->FillInputs(5);
    hsap::v1::CallId call;
    call.set_group("scratch");
    call.set_group_size(1);
    call.set_call_seq(1);
    const auto mask = client::DocumentMask({0, kTokens}, true);
    auto fwd = (*client)->Forward((*b)->ForwardRequest(call, mask, {}));
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    call.set_call_seq(2);
    auto bwd = (*client)->Backward((*b)->BackwardRequest(call, mask, {}));
    ASSERT_TRUE(bwd.ok()) << bwd.status();
    const double kept = metrics::testing::ScrapeSample(metrics_port, "hsap_kernel_scratch_cached_bytes");
#if defined(__SANITIZE_ADDRESS__) || defined(ADDRESS_SANITIZER) || \
    defined(__SANITIZE_THREAD__) || defined(THREAD_SANITIZER)
    EXPECT_EQ(kept, 0) << "sanitized builds cache nothing";
#else
    if (limit == 0) {
      EXPECT_EQ(kept, 0);
    } else {
      EXPECT_GE(kept, 1 << 20);  // 4 MiB of packed K/V alone
      EXPECT_LE(kept, expected_limit);
    }
#endif
  }
}

TEST(DaemonProcessTest, ANegativeScratchCacheIsRefusedAtStart) {
  const testing::HsapdExit run = testing::RunHsapdUntilExit("--kernel_scratch_cache_bytes=-1");
  ASSERT_TRUE(WIFEXITED(run.status)) << run.output;
  EXPECT_EQ(WEXITSTATUS(run.status), 1) << run.output;
  EXPECT_NE(run.output.find("kernel_scratch_cache_bytes is -1; it must be >= 0"), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace hsap

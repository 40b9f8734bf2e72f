// The shared TCP token (--token_file, server/grpc/tcp_auth.h): every method
// of every hsap.v1 service answers UNAUTHENTICATED over TCP without the
// right token and serves with it; the Unix socket keeps the session model;
// ListRegions over TCP with the token is the operator's view of all
// sessions; health stays open for probes; hsapd refuses a token file that
// its group or others can read.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/cpp/hsap_client.h"
#include "common/auth_token.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "gtest/gtest.h"
#include "hsap/v1/attention.grpc.pb.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "hsap/v1/regions.grpc.pb.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/test_daemon.h"

namespace hsap {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

class TcpAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonOptions options;
    port_ = testing::FreePort();
    options.tcp_port = port_;
    options.tcp_token = kToken;
    daemon_ = testing::StartInProcessDaemon(options);
    ASSERT_NE(daemon_, nullptr);
  }
  std::shared_ptr<grpc::Channel> Tcp(const std::string& token) {
    return CreateChannelWithToken(absl::StrCat("127.0.0.1:", port_), token);
  }

  int port_ = 0;
  std::unique_ptr<testing::InProcessDaemon> daemon_;
};

// Calls `/service/method` with an empty request (every request type parses
// zero bytes) and returns the status.
grpc::Status CallEmpty(grpc::Channel* channel, const std::string& path) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  const grpc::internal::RpcMethod method(path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  hsap::v1::GetPlanCacheStatsRequest request;  // empty: zero bytes on the wire
  hsap::v1::GetPlanCacheStatsResponse response;  // never read
  return grpc::internal::BlockingUnaryCall(channel, method, &context, request, &response);
}

TEST_F(TcpAuthTest, EveryMethodOverTcpNeedsTheToken) {
  auto none = Tcp("");
  auto wrong = Tcp("s3cret-token-0123456789abcdeX");
  int methods = 0;
  for (const std::string service :
       {hsap::v1::Attention::service_full_name(), hsap::v1::Regions::service_full_name(),
        hsap::v1::Plans::service_full_name(), hsap::v1::Cluster::service_full_name()}) {
    const auto* desc =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    ASSERT_NE(desc, nullptr) << service;
    for (int i = 0; i < desc->method_count(); ++i) {
      const std::string path = absl::StrCat("/", service, "/", desc->method(i)->name());
      ++methods;
      const grpc::Status a = CallEmpty(none.get(), path);
      EXPECT_EQ(a.error_code(), grpc::StatusCode::UNAUTHENTICATED) << path << ": " << a.error_message();
      EXPECT_THAT(a.error_message(), HasSubstr("authorization: Bearer")) << path;
      const grpc::Status b = CallEmpty(wrong.get(), path);
      EXPECT_EQ(b.error_code(), grpc::StatusCode::UNAUTHENTICATED) << path;
      EXPECT_THAT(b.error_message(), HasSubstr("does not match")) << path;
    }
  }
  EXPECT_GE(methods, 13);
}

TEST_F(TcpAuthTest, WithTheTokenTcpCallsServe) {
  auto plans = hsap::v1::Plans::NewStub(Tcp(kToken));
  grpc::ClientContext context;
  hsap::v1::GetPlanCacheStatsResponse stats;
  const grpc::Status s = plans->GetPlanCacheStats(&context, {}, &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  auto cluster = hsap::v1::Cluster::NewStub(Tcp(kToken));
  grpc::ClientContext context2;
  hsap::v1::GetClusterStatusResponse status;
  ASSERT_TRUE(cluster->GetClusterStatus(&context2, {}, &status).ok());
  EXPECT_TRUE(status.formed());
  // A bare "Bearer" prefix with the token in another header is not enough.
  auto raw = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials());
  grpc::ClientContext context3;
  context3.AddMetadata("authorization", kToken);  // no "Bearer "
  auto plans_raw = hsap::v1::Plans::NewStub(raw);
  EXPECT_EQ(plans_raw->GetPlanCacheStats(&context3, {}, &stats).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(TcpAuthTest, HealthStaysOpenForProbes) {
  auto health = grpc::health::v1::Health::NewStub(Tcp(""));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, {}, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TcpAuthTest, UnixSocketKeepsSessionsAndOperatorSeesAllRegions) {
  auto a = client::Client::Connect(daemon_->socket());
  auto b = client::Client::Connect(daemon_->socket());
  ASSERT_TRUE(a.ok() && b.ok());
  auto buf_a = (*a)->CreateBuffer(4096, "a-region");
  auto buf_b = (*b)->CreateBuffer(8192, "b-region");
  ASSERT_TRUE(buf_a.ok() && buf_b.ok());
  // Over the Unix socket: a session sees its own regions only, no token needed.
  auto own = (*a)->ListRegions();
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->regions_size(), 1);
  EXPECT_EQ(own->regions(0).name(), "a-region");
  // Over TCP with the token: every session's regions.
  auto regions = hsap::v1::Regions::NewStub(Tcp(kToken));
  grpc::ClientContext context;
  hsap::v1::ListRegionsResponse all;
  ASSERT_TRUE(regions->ListRegions(&context, {}, &all).ok());
  ASSERT_EQ(all.regions_size(), 2);
  EXPECT_EQ(all.total_bytes(), 4096u + 8192u);
  EXPECT_EQ(all.sessions(), 2u);
  EXPECT_NE(all.regions(0).session_id(), all.regions(1).session_id());
  // Registering over TCP still needs a session (regions are local).
  grpc::ClientContext context2;
  hsap::v1::RegisterRegionRequest reg;
  reg.set_size_bytes(16);
  reg.mutable_shm()->set_name("/x");
  hsap::v1::RegisterRegionResponse reg_resp;
  EXPECT_EQ(regions->RegisterRegion(&context2, reg, &reg_resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

std::string WriteToken(const std::string& name, const std::string& token, mode_t mode) {
  const char* dir = getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  unlink(path.c_str());
  std::ofstream(path) << token << "\n";
  chmod(path.c_str(), mode);
  return path;
}

TEST(TokenFileTest, HsapdRefusesAReadableTokenFile) {
  const std::string token = WriteToken("world_readable", kToken, 0644);
  const testing::HsapdExit run = testing::RunHsapdUntilExit(
      absl::StrCat("--port=", testing::FreePort(), " --token_file=", token));
  const std::string& text = run.output;
  ASSERT_TRUE(WIFEXITED(run.status)) << text;
  EXPECT_EQ(WEXITSTATUS(run.status), 1) << text;
  EXPECT_THAT(text, HasSubstr("refuses to start"));
  EXPECT_THAT(text, HasSubstr("mode 0644"));
  EXPECT_THAT(text, HasSubstr("chmod 600"));
}

absl::StatusOr<hsap::v1::GetClusterStatusResponse> Status(const std::string& socket) {
  auto stub = hsap::v1::Cluster::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  hsap::v1::GetClusterStatusResponse response;
  const grpc::Status s = stub->GetClusterStatus(&context, {}, &response);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return response;
}

TEST(ClusterTokenTest, ThreeNodesWithTheTokenFormAndAWrongTokenCannotJoin) {
  const std::string good = WriteToken("good", kToken, 0600);
  const std::string bad = WriteToken("bad", "another-token-0123456789abcdef", 0400);
  const std::vector<std::string> flags = {"--ucx_transports=tcp", "--heartbeat_ms=100",
                                          "--peer_down_ms=1500"};
  {
    auto cluster = testing::LocalCluster::Start(3, 1, flags,
                                                {{"--token_file=" + good},
                                                 {"--token_file=" + good},
                                                 {"--token_file=" + good}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const absl::Status formed = (*cluster)->WaitFormed(absl::Seconds(30));
    ASSERT_TRUE(formed.ok()) << formed;
  }
  // Node 2 holds another token: nodes 0 and 1 see each other UP, node 2
  // never; nobody is formed. Restarted with the right token, it joins.
  auto cluster = testing::LocalCluster::Start(
      3, 1, flags, {{"--token_file=" + good}, {"--token_file=" + good}, {"--token_file=" + bad}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_FALSE((*cluster)->WaitFormed(absl::Seconds(4)).ok());
  for (int node = 0; node < 3; ++node) {
    auto s = Status((*cluster)->node(node)->socket());
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(s->formed()) << "node " << node;
    ASSERT_EQ(s->nodes_size(), 3);
    if (node < 2) {
      EXPECT_EQ(s->nodes(1 - node).state(), hsap::v1::NODE_STATE_UP) << "node " << node;
      EXPECT_NE(s->nodes(2).state(), hsap::v1::NODE_STATE_UP) << "node " << node;
    } else {
      EXPECT_NE(s->nodes(0).state(), hsap::v1::NODE_STATE_UP);
      EXPECT_NE(s->nodes(1).state(), hsap::v1::NODE_STATE_UP);
    }
  }
  (*cluster)->SetNodeFlags(2, {"--token_file=" + good});
  ASSERT_TRUE((*cluster)->Restart(2).ok());
  const absl::Status formed = (*cluster)->WaitFormed(absl::Seconds(30));
  EXPECT_TRUE(formed.ok()) << formed;
}

}  // namespace
}  // namespace hsap

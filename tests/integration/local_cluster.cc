#include "tests/integration/local_cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/cluster.grpc.pb.h"

namespace hsap::testing {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(int nodes, int devices,
                                                                  std::vector<std::string> flags) {
  return Start(nodes, devices, std::move(flags), {});
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    int nodes, int devices, std::vector<std::string> flags,
    std::vector<std::vector<std::string>> node_flags) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->devices_ = devices;
  c->flags_ = std::move(flags);
  c->node_flags_ = std::move(node_flags);
  c->node_flags_.resize(nodes);
  for (int i = 0; i < nodes; ++i) c->ports_.push_back(FreePort());
  c->procs_.resize(nodes);
  for (int i = 0; i < nodes; ++i) {
    auto p = c->StartNode(i);
    if (!p.ok()) return p.status();
    c->procs_[i] = std::move(p).value();
  }
  return c;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::StartWithoutPeers(
    int nodes, int devices, std::vector<std::string> flags,
    std::vector<std::vector<std::string>> node_flags) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->devices_ = devices;
  c->static_peers_ = false;
  c->flags_ = std::move(flags);
  c->node_flags_ = std::move(node_flags);
  c->node_flags_.resize(nodes);
  for (int i = 0; i < nodes; ++i) c->ports_.push_back(FreePort());
  c->procs_.resize(nodes);
  for (int i = 0; i < nodes; ++i) {
    auto p = c->StartNode(i);
    if (!p.ok()) return p.status();
    c->procs_[i] = std::move(p).value();
  }
  return c;
}

std::string LocalCluster::address(int i) const { return absl::StrCat("127.0.0.1:", ports_[i]); }

absl::StatusOr<std::unique_ptr<DaemonProcess>> LocalCluster::StartNode(int i) {
  std::vector<std::string> peers;
  for (int port : ports_) peers.push_back(absl::StrCat("127.0.0.1:", port));
  std::vector<std::string> flags = flags_;
  if (i < static_cast<int>(node_flags_.size())) {
    flags.insert(flags.end(), node_flags_[i].begin(), node_flags_[i].end());
  }
  // Loopback: peers need no authentication unless the test gives some.
  const bool authenticated = std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f.rfind("--token_file", 0) == 0 || f.rfind("--tls_", 0) == 0;
  });
  if (!authenticated) flags.push_back("--insecure_peers");
  flags.push_back(absl::StrCat("--devices=cpu:", devices_));
  flags.push_back(absl::StrCat("--port=", ports_[i]));
  if (static_peers_) {
    flags.push_back(absl::StrCat("--peers=", absl::StrJoin(peers, ",")));
    flags.push_back(absl::StrCat("--node_rank=", i));
  }
  return DaemonProcess::Start(Runfile("server/hsapd"), flags);
}

std::vector<std::string> LocalCluster::sockets() const {
  std::vector<std::string> out;
  for (const auto& p : procs_) out.push_back(p != nullptr ? p->socket() : "");
  return out;
}

absl::StatusOr<hsap::v1::GetClusterStatusResponse> LocalCluster::Status(int i) const {
  auto stub = hsap::v1::Cluster::NewStub(
      grpc::CreateChannel("unix:" + procs_[i]->socket(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  hsap::v1::GetClusterStatusResponse resp;
  const grpc::Status st = stub->GetClusterStatus(&ctx, {}, &resp);
  if (!st.ok()) return absl::UnavailableError(st.error_message());
  return resp;
}

absl::Status LocalCluster::WaitFormed(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (int i = 0; i < nodes(); ++i) {
    while (true) {
      auto status = Status(i);
      if (status.ok() && status->formed()) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat("node ", i, " did not see the cluster formed"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

void LocalCluster::Kill(int i) {
  procs_[i]->Signal(SIGKILL);
  procs_[i]->Wait(10);
}

void LocalCluster::SetNodeFlags(int i, std::vector<std::string> flags) {
  if (static_cast<int>(node_flags_.size()) <= i) node_flags_.resize(i + 1);
  node_flags_[i] = std::move(flags);
}

absl::Status LocalCluster::Restart(int i) {
  procs_[i].reset();
  auto p = StartNode(i);
  if (!p.ok()) return p.status();
  procs_[i] = std::move(p).value();
  return absl::OkStatus();
}

}  // namespace hsap::testing

// Shared by the bad-input tests (bad_inputs_test.cc, bad_inputs_transport_cases.cc):
// the environment every case runs against (a real hsapd, a client session,
// good requests to edit), the case table's row type and the helpers the
// cases call. See bad_inputs_test.cc for what the suite checks.
#ifndef HSAP_TESTS_INTEGRATION_BAD_INPUTS_ENV_H_
#define HSAP_TESTS_INTEGRATION_BAD_INPUTS_ENV_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/attention_buffers.h"
#include "client/cpp/hsap_client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "hsap/v1/cluster.grpc.pb.h"
#include "hsap/v1/plans.grpc.pb.h"
#include "hsap/v1/regions.pb.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/raw_daemon_io.h"
#include "tests/integration/test_daemon.h"

namespace hsap::bad_inputs {

using Code = absl::StatusCode;

constexpr int64_t kTokens = 64;
constexpr int64_t kHq = 4, kHkv = 2, kD = 32;
inline const std::vector<int64_t> kCu = {0, 10, 10, 40, kTokens};

inline absl::Status FromGrpc(const grpc::Status& st) {
  return absl::Status(static_cast<Code>(st.error_code()), st.error_message());
}

using namespace ::hsap::testing;  // raw_daemon_io.h

// ---------------------------------------------------------------------------
// The environment every case runs against.

struct Env {
  std::unique_ptr<testing::DaemonProcess> daemon;
  int port = 0;
  std::unique_ptr<client::Client> client;
  std::unique_ptr<client::AttentionBuffers> buf;
  std::unique_ptr<client::Client> other;  // a second session
  std::unique_ptr<client::AttentionBuffers> other_buf;
  int64_t rank0_tokens = 0, rank1_tokens = 0;  // the 2-rank dispatch of kCu

  hsap::v1::CallId Call(const std::string& group = "bad", uint64_t seq = 1) const {
    hsap::v1::CallId id;
    id.set_group(group);
    id.set_group_size(1);
    id.set_call_seq(seq);
    return id;
  }
  hsap::v1::AttentionForwardRequest Good() const {
    return buf->ForwardRequest(Call(), client::DocumentMask(kCu, true), {});
  }
  hsap::v1::AttentionBackwardRequest GoodBackward() const {
    return buf->BackwardRequest(Call(), client::DocumentMask(kCu, true), {});
  }
  absl::Status Forward(const hsap::v1::AttentionForwardRequest& r) const {
    return client->Forward(r).status();
  }
  absl::Status Backward(const hsap::v1::AttentionBackwardRequest& r) const {
    return client->Backward(r).status();
  }
  // Waits up to 10 s until no memfd named `name` is mapped in the daemon.
  absl::Status WaitUnmapped(const std::string& name) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (CountMemfdMappings(daemon->Maps(), name) > 0) {
      if (absl::Now() > deadline) {
        return absl::InternalError(absl::StrCat("memfd '", name, "' is still mapped in the daemon"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::OkStatus();
  }
};

// Rank `rank` of a 2-rank group on this daemon (tokens from the dispatch).
inline absl::StatusOr<std::unique_ptr<client::AttentionBuffers>> RankBuffers(client::Client* c,
                                                                      int64_t tokens,
                                                                      const std::string& name) {
  auto b = client::AttentionBuffers::Create(c, {tokens, kHq, kHkv, kD, DType::kFloat32}, name);
  if (b.ok()) (*b)->FillInputs(7);
  return b;
}

inline hsap::v1::CallId TwoRankCall(const std::string& group, int rank, uint64_t seq) {
  hsap::v1::CallId id;
  id.set_group(group);
  id.set_group_size(2);
  id.set_rank(rank);
  id.set_call_seq(seq);
  return id;
}

inline hsap::v1::CallOptions Deadline(uint32_t ms) {
  hsap::v1::CallOptions o;
  o.set_deadline_ms(ms);
  return o;
}

// The helper process (see the file comment).
inline int Rank0Helper(const std::string& socket, int64_t tokens) {
  auto c = client::Client::Connect(socket);
  if (!c.ok()) return 2;
  auto b = RankBuffers(c->get(), tokens, "killed-rank0");
  if (!b.ok()) return 3;
  const auto req = (*b)->ForwardRequest(TwoRankCall("killed", 0, 1), client::DocumentMask(kCu, true),
                                        Deadline(1500));
  std::printf("ready\n");
  std::fflush(stdout);
  (void)(*c)->Forward(req);  // blocks until killed (or the deadline)
  return 4;
}

// Starts the helper, waits for "ready", lets it enter the call, kills it.
inline absl::Status RunAndKillHelper(const Env& env) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const std::string self = "/proc/self/exe";
  const std::string tokens = std::to_string(env.rank0_tokens);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    execl(self.c_str(), self.c_str(), "--rank0_helper", env.daemon->socket().c_str(),
          tokens.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  UniqueFd read_end(out[0]);
  pollfd p = {read_end.get(), POLLIN, 0};
  char buf[16] = {};
  const bool ready = poll(&p, 1, 20000) == 1 && read(read_end.get(), buf, sizeof(buf) - 1) > 0;
  absl::SleepFor(absl::Milliseconds(500));  // inside Forward, waiting for rank 1
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!ready) return absl::InternalError("the helper did not get ready within 20 s");
  if (!WIFSIGNALED(status)) {
    return absl::InternalError(absl::StrCat("the helper left the call before the kill, status ",
                                            status));
  }
  return absl::OkStatus();
}

struct Case {
  std::string name;
  std::function<absl::Status(Env&)> run;
  Code code;
  std::string text;
};

template <typename Edit>
std::function<absl::Status(Env&)> EditForward(Edit edit) {
  return [edit](Env& e) {
    auto r = e.Good();
    edit(e, r);
    return e.Forward(r);
  };
}

template <typename Edit>
std::function<absl::Status(Env&)> EditBackward(Edit edit) {
  return [edit](Env& e) {
    auto r = e.GoodBackward();
    edit(e, r);
    return e.Backward(r);
  };
}

using Fwd = hsap::v1::AttentionForwardRequest;
using Bwd = hsap::v1::AttentionBackwardRequest;

inline absl::Status Register(Env& e, const hsap::v1::RegisterRegionRequest& r) {
  return e.client->RegisterRegion(r).status();
}

// A raw gRPC call: `bytes` as the serialized request of `method`.
inline absl::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, const client::Client* session = nullptr) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (session != nullptr) session->Authorize(&ctx);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status st) { done.set_value(st); });
  return FromGrpc(done.get_future().get());
}

inline std::shared_ptr<grpc::Channel> TcpChannel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}


// The cases on regions, the session socket, raw bytes and the TCP port
// (bad_inputs_transport_cases.cc).
std::vector<Case> TransportCases();

}  // namespace hsap::bad_inputs

#endif  // HSAP_TESTS_INTEGRATION_BAD_INPUTS_ENV_H_

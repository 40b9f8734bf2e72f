#include "server/shm/session_socket.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/fd_passing.h"
#include "gtest/gtest.h"
#include "hsap/v1/regions.pb.h"

namespace hsap::shm {
namespace {

// A fresh directory under /tmp, removed with what it holds when this goes
// out of scope. Unix socket paths are limited to 107 bytes: Bazel's
// TEST_TMPDIR is too deep. Declare it before the server whose socket lives
// there, so the server is gone first.
class ShortTempDir {
 public:
  ShortTempDir() {
    char tmpl[] = "/tmp/hsap-test-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    path_ = tmpl;
  }
  ShortTempDir(const ShortTempDir&) = delete;
  ShortTempDir& operator=(const ShortTempDir&) = delete;
  ~ShortTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

void SendFd(int sock, uint64_t transfer_id, int fd) {
  hsap::v1::SessionFdTransfer t;
  t.set_transfer_id(transfer_id);
  std::string bytes = t.SerializeAsString();
  ASSERT_EQ(SendWithFds(sock, bytes, {fd}, 0), static_cast<ssize_t>(bytes.size()));
}

template <typename M>
M Receive(int sock) {
  char buf[4096];
  const ssize_t n = recv(sock, buf, sizeof(buf), 0);
  M m;
  EXPECT_GT(n, 0);
  EXPECT_TRUE(m.ParseFromArray(buf, static_cast<int>(n)));
  return m;
}

TEST(SessionSocketTest, PassesFdsAndReclaimsOnDisconnect) {
  RegionRegistry registry;
  SessionManager sessions(&registry);
  ShortTempDir dir;
  const std::string path = dir.path() + "/s.sock";
  auto server = SessionSocket::Start(path, &sessions, getuid());
  ASSERT_TRUE(server.ok()) << server.status();

  const int sock = Connect(path);
  const auto hello = Receive<hsap::v1::SessionHello>(sock);
  EXPECT_GT(hello.session_id(), 0u);
  EXPECT_EQ(hello.session_token().size(), 32u);
  EXPECT_TRUE(sessions.Authenticate(hello.session_id(), hello.session_token()).ok());
  EXPECT_EQ(sessions.Authenticate(hello.session_id(), "wrong").code(),
            absl::StatusCode::kUnauthenticated);

  const int mfd = memfd_create("hsap-session-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(mfd, 4096), 0);
  SendFd(sock, 42, mfd);
  auto ack = Receive<hsap::v1::SessionFdAck>(sock);
  EXPECT_EQ(ack.code(), 0) << ack.message();
  SendFd(sock, 42, mfd);  // reused transfer id
  ack = Receive<hsap::v1::SessionFdAck>(sock);
  EXPECT_EQ(ack.code(), static_cast<int>(absl::StatusCode::kAlreadyExists));
  close(mfd);

  auto fd = sessions.TakePendingFd(hello.session_id(), 42);
  ASSERT_TRUE(fd.ok());
  auto mapping = MappedRegion::FromFd(fd->get(), 4096, RegionKind::kMemfd);
  ASSERT_TRUE(mapping.ok());
  ASSERT_TRUE(registry.Register(hello.session_id(), "r", std::move(mapping).value()).ok());
  EXPECT_EQ(sessions.TakePendingFd(hello.session_id(), 42).status().code(),
            absl::StatusCode::kNotFound);

  close(sock);  // the client goes away without unregistering
  for (int i = 0; i < 200 && registry.total_bytes() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(registry.total_bytes(), 0u);
  EXPECT_EQ(sessions.num_sessions(), 0);
  EXPECT_EQ(sessions.Authenticate(hello.session_id(), hello.session_token()).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(SessionSocketTest, GarbageEndsTheSessionOnly) {
  RegionRegistry registry;
  SessionManager sessions(&registry);
  ShortTempDir dir;
  const std::string path = dir.path() + "/s.sock";
  auto server = SessionSocket::Start(path, &sessions, getuid());
  ASSERT_TRUE(server.ok());
  const int bad = Connect(path);
  Receive<hsap::v1::SessionHello>(bad);
  const char junk[] = "\xff\xff\xff\xff garbage";
  ASSERT_GT(send(bad, junk, sizeof(junk), 0), 0);
  char buf[16];
  EXPECT_EQ(recv(bad, buf, sizeof(buf), 0), 0);  // daemon closed it
  close(bad);
  const int good = Connect(path);
  EXPECT_GT(Receive<hsap::v1::SessionHello>(good).session_id(), 0u);
  close(good);
}

// Sends a transfer without waiting (MSG_DONTWAIT); false once the socket
// buffer is full.
bool TrySendFd(int sock, uint64_t transfer_id, int fd) {
  hsap::v1::SessionFdTransfer t;
  t.set_transfer_id(transfer_id);
  std::string bytes = t.SerializeAsString();
  return SendWithFds(sock, bytes, {fd}, MSG_DONTWAIT) == static_cast<ssize_t>(bytes.size());
}

// A client that floods transfers and never reads its acks is throttled;
// other sessions' hellos and fd passes are served at once meanwhile.
TEST(SessionSocketTest, ASlowReaderDoesNotBlockOtherSessions) {
  RegionRegistry registry;
  SessionManager sessions(&registry);
  ShortTempDir dir;
  const std::string path = dir.path() + "/s.sock";
  auto server = SessionSocket::Start(path, &sessions, getuid());
  ASSERT_TRUE(server.ok());
  const int flooder = Connect(path);
  const auto flood_hello = Receive<hsap::v1::SessionHello>(flooder);
  const int mfd = memfd_create("hsap-flood", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(mfd, 4096), 0);
  int sent = 0;
  for (uint64_t id = 1; id <= 2000 && TrySendFd(flooder, id, mfd); ++id) ++sent;
  std::printf("the flooder got %d transfers into its socket before it filled\n", sent);
  EXPECT_GT(sent, SessionSocket::kMaxQueuedAcks);
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    const int other = Connect(path);
    timeval tv = {2, 0};
    setsockopt(other, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const auto hello = Receive<hsap::v1::SessionHello>(other);
    EXPECT_GT(hello.session_id(), 0u);
    SendFd(other, 7, mfd);
    const auto ack = Receive<hsap::v1::SessionFdAck>(other);
    EXPECT_EQ(ack.code(), 0) << ack.message();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(ms, 500) << "round " << round;
    close(other);
  }
  // The flooder's session is alive and gets every ack, in order, once it reads.
  EXPECT_TRUE(sessions.Authenticate(flood_hello.session_id(), flood_hello.session_token()).ok());
  timeval tv = {5, 0};
  setsockopt(flooder, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  for (int i = 1; i <= sent; ++i) {
    const auto ack = Receive<hsap::v1::SessionFdAck>(flooder);
    ASSERT_EQ(ack.transfer_id(), static_cast<uint64_t>(i));
    // 64 pending fds at most per session: later ones are refused, in order.
    EXPECT_EQ(ack.code(), i <= SessionManager::kMaxPendingFds
                              ? 0
                              : static_cast<int>(absl::StatusCode::kResourceExhausted));
  }
  close(mfd);
  close(flooder);
}

// A client floods transfers that carry its own socket until the daemon
// throttles it and its buffer is full, then exits. The transfers the daemon
// has not read hold the client's end open, so no hang-up ever comes: only
// the stall timeout ends the session. With an hour's timeout it is still
// alive after 2 s (the hazard); with 1 s it ends.
TEST(SessionSocketTest, AThrottledClientThatLeftIsClosedAfterTheStallTimeout) {
  for (const absl::Duration stall : {absl::Hours(1), absl::Seconds(1)}) {
    RegionRegistry registry;
    SessionManager sessions(&registry);
    ShortTempDir dir;
    const std::string path = dir.path() + "/s.sock";
    auto server = SessionSocket::Start(path, &sessions, getuid(), stall);
    ASSERT_TRUE(server.ok());
    const int client = Connect(path);
    Receive<hsap::v1::SessionHello>(client);
    // Send until the daemon stops reading: our acks fill our receive queue,
    // the daemon's queue of acks fills (throttled), then our sends fill its
    // receive queue and stay there for 300 ms.
    int sent = 0;
    for (uint64_t id = 1; id <= 20000; ++id) {
      if (!TrySendFd(client, id, client)) {
        pollfd p = {client, POLLOUT, 0};
        if (poll(&p, 1, 300) != 1 || !TrySendFd(client, id, client)) break;
      }
      ++sent;
    }
    EXPECT_GT(sent, SessionSocket::kMaxQueuedAcks);
    close(client);
    const auto start = std::chrono::steady_clock::now();
    const auto waited = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    while (sessions.num_sessions() != 0 && waited() < 4.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf("stall timeout %s: %d transfers sent; after %.2f s %d session(s) open\n",
                absl::FormatDuration(stall).c_str(), sent, waited(), sessions.num_sessions());
    if (stall > absl::Minutes(1)) {
      EXPECT_EQ(sessions.num_sessions(), 1) << "the hazard did not arise: the test shows nothing";
    } else {
      EXPECT_EQ(sessions.num_sessions(), 0);
    }
  }
}

TEST(SessionSocketTest, SessionsPastTheCapGetAHelloWithResourceExhausted) {
  RegionRegistry registry;
  std::vector<std::string> refused;
  SessionManager sessions(&registry, 2, [&refused](const char* flag) { refused.push_back(flag); });
  ShortTempDir dir;
  const std::string path = dir.path() + "/s.sock";
  auto server = SessionSocket::Start(path, &sessions, getuid());
  ASSERT_TRUE(server.ok());
  const int a = Connect(path), b = Connect(path);
  EXPECT_GT(Receive<hsap::v1::SessionHello>(a).session_id(), 0u);
  EXPECT_GT(Receive<hsap::v1::SessionHello>(b).session_id(), 0u);
  const int c = Connect(path);
  const auto refusal = Receive<hsap::v1::SessionHello>(c);
  EXPECT_EQ(refusal.session_id(), 0u);
  EXPECT_EQ(refusal.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(refusal.message().find("--max_sessions"), std::string::npos) << refusal.message();
  char buf[16];
  EXPECT_EQ(recv(c, buf, sizeof(buf), 0), 0);  // and closed
  EXPECT_EQ(refused, std::vector<std::string>{"max_sessions"});
  close(c);
  close(a);  // a slot frees up
  for (int i = 0; i < 200 && sessions.num_sessions() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int d = Connect(path);
  EXPECT_GT(Receive<hsap::v1::SessionHello>(d).session_id(), 0u);
  close(b);
  close(d);
}

}  // namespace
}  // namespace hsap::shm

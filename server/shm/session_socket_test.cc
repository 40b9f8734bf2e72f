#include "server/shm/session_socket.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"
#include "hsap/v1/regions.pb.h"

namespace hsap::shm {
namespace {

// Unix socket paths are limited to 107 bytes: Bazel's TEST_TMPDIR is too deep.
std::string ShortTempDir() {
  char tmpl[] = "/tmp/hsap-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

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
  iovec iov = {bytes.data(), bytes.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  ASSERT_EQ(sendmsg(sock, &msg, 0), static_cast<ssize_t>(bytes.size()));
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
  const std::string path = ShortTempDir() + "/s.sock";
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
  const std::string path = ShortTempDir() + "/s.sock";
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

}  // namespace
}  // namespace hsap::shm

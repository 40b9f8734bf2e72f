// Raw views of a running hsapd for the bad-input tests: its /proc fds and
// memfd mappings, garbage on its stream sockets, and a raw session-socket
// connection. Test-only helpers, header-only.
#ifndef HSAP_TESTS_INTEGRATION_RAW_DAEMON_IO_H_
#define HSAP_TESTS_INTEGRATION_RAW_DAEMON_IO_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/unique_fd.h"
#include "grpcpp/create_channel.h"
#include "hsap/v1/regions.grpc.pb.h"

namespace hsap::testing {

// ---------------------------------------------------------------------------
// /proc views of the daemon.

inline int CountFds(pid_t pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// "fd -> target" lines, for failure messages.
inline std::string FdList(pid_t pid) {
  std::string out;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    (void)!readlink(absl::StrCat(dir, "/", e->d_name).c_str(), target, sizeof(target) - 1);
    absl::StrAppend(&out, e->d_name, " -> ", target, "\n");
  }
  closedir(d);
  return out;
}

// Lines of /proc/<pid>/maps that map a memfd (optionally one named `name`).
inline int CountMemfdMappings(const std::string& maps, const std::string& name = "") {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(maps, '\n')) {
    if (line.find("/memfd:" + name) != absl::string_view::npos) ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------
// Raw sockets.

// Writes `bytes` to a stream socket connected to `addr`, then reads until the
// daemon hangs up (5 s at most). See the file comment for the codes.
inline absl::Status SendGarbage(const sockaddr* addr, socklen_t len, int family, const std::string& bytes) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  if (connect(fd, addr, len) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("connect failed: ", strerror(errno)));
  }
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the daemon may hang up while we write
    sent += n;
  }
  std::string got;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  bool closed = false;
  while (absl::Now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      closed = true;
      break;
    }
    got.append(buf, n);
  }
  close(fd);
  // Server frames: 9-byte headers (length 24 bits, type, flags, stream id).
  std::string goaway;
  for (size_t at = 0; at + 9 <= got.size();) {
    const size_t flen = (uint8_t(got[at]) << 16) | (uint8_t(got[at + 1]) << 8) | uint8_t(got[at + 2]);
    if (got[at + 3] == 7 && at + 9 + 8 <= got.size()) {
      const uint32_t code = (uint8_t(got[at + 13]) << 24) | (uint8_t(got[at + 14]) << 16) |
                            (uint8_t(got[at + 15]) << 8) | uint8_t(got[at + 16]);
      goaway = absl::StrCat(", GOAWAY error ", code);
    }
    at += 9 + flen;
  }
  if (!closed) {
    return absl::DeadlineExceededError(
        absl::StrCat("the daemon kept the connection open 5 s after ", sent, " bytes of garbage"));
  }
  return absl::UnavailableError(absl::StrCat("the daemon closed the connection after reading ",
                                             sent, " of ", bytes.size(), " bytes (it sent ",
                                             got.size(), " bytes", goaway, ")"));
}

inline absl::Status GarbageOnUnix(const std::string& path, const std::string& bytes) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return SendGarbage(reinterpret_cast<sockaddr*>(&addr), sizeof(addr), AF_UNIX, bytes);
}

inline absl::Status GarbageOnTcp(int port, const std::string& bytes) {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  return SendGarbage(reinterpret_cast<sockaddr*>(&addr), sizeof(addr), AF_INET, bytes);
}

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// An HTTP/2 client preface, an empty SETTINGS frame, then one frame whose
// header declares `length` bytes, followed by `payload`.
inline std::string PrefaceThenFrame(uint8_t type, uint32_t stream, uint32_t length,
                             const std::string& payload) {
  std::string s = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  s += std::string("\x00\x00\x00\x04\x00\x00\x00\x00\x00", 9);
  s += static_cast<char>(length >> 16);
  s += static_cast<char>(length >> 8);
  s += static_cast<char>(length);
  s += static_cast<char>(type);
  s += '\0';
  for (int i = 3; i >= 0; --i) s += static_cast<char>(stream >> (8 * i));
  return s + payload;
}

inline UniqueFd NewMemfd(const char* name, off_t size) {
  UniqueFd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.valid() && ftruncate(fd.get(), size) != 0) return UniqueFd();
  return fd;
}

// A raw connection to the session socket, with the daemon's hello.
class RawSession {
 public:
  absl::Status Open(const std::string& socket) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, (socket + ".session").c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError("cannot connect to the session socket");
    }
    timeval tv = {5, 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const ssize_t n = recv(fd_.get(), buf, sizeof(buf), 0);
    if (n <= 0 || !hello_.ParseFromArray(buf, n)) return absl::InternalError("no SessionHello");
    return absl::OkStatus();
  }

  // Sends one message with `fds` attached.
  bool Send(const std::string& bytes, const std::vector<int>& fds) {
    iovec iov = {const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
    if (!fds.empty()) {
      msg.msg_control = control.data();
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    return sendmsg(fd_.get(), &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }

  // The daemon's answer: the ack's code and message; or, when the daemon
  // closed the session, what a gRPC call with its credentials gets now.
  absl::Status Outcome(const std::string& grpc_socket) {
    char buf[4096];
    const ssize_t n = recv(fd_.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      hsap::v1::SessionFdAck ack;
      if (!ack.ParseFromArray(buf, n)) return absl::InternalError("unparsable SessionFdAck");
      return absl::Status(static_cast<absl::StatusCode>(ack.code()),
                          absl::StrCat("ack of transfer ", ack.transfer_id(), ": ", ack.message()));
    }
    if (n < 0) return absl::DeadlineExceededError("no answer on the session socket within 5 s");
    auto stub = hsap::v1::Regions::NewStub(
        grpc::CreateChannel("unix:" + grpc_socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("hsap-session-id", std::to_string(hello_.session_id()));
    ctx.AddMetadata("hsap-session-token", hello_.session_token());
    hsap::v1::ListRegionsResponse resp;
    const grpc::Status st = stub->ListRegions(&ctx, {}, &resp);
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("session closed by the daemon; then: ", st.error_message()));
  }

  const hsap::v1::SessionHello& hello() const { return hello_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  hsap::v1::SessionHello hello_;
};

inline std::string TransferMessage(uint64_t id) {
  hsap::v1::SessionFdTransfer t;
  t.set_transfer_id(id);
  return t.SerializeAsString();
}


}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_RAW_DAEMON_IO_H_

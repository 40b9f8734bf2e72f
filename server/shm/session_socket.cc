#include "server/shm/session_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/version.h"
#include "hsap/v1/regions.pb.h"

namespace hsap::shm {
namespace {

constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kMaxMessage = 4096;

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

bool SendProto(int fd, const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

struct Connection {
  UniqueFd fd;
  uint64_t session = 0;
};

// Reads one message with at most one fd. Returns false when the peer is gone
// or broke the protocol (the session then ends).
bool HandleMessage(Connection& c, SessionManager* sessions) {
  char buf[kMaxMessage];
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  struct iovec iov = {buf, sizeof(buf)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(c.fd.get(), &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return false;
  // Take ownership of any fds before deciding anything: a zero-length
  // message can carry SCM_RIGHTS too, and n == 0 (read as a hang-up below)
  // must not leak them.
  std::vector<UniqueFd> fds;
  for (struct cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  if (n == 0) return false;
  hsap::v1::SessionFdTransfer transfer;
  hsap::v1::SessionFdAck ack;
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
      !transfer.ParseFromArray(buf, static_cast<int>(n))) {
    HSAP_LOG(WARNING) << "session " << c.session << ": malformed message of " << n
                      << " bytes; closing it";
    return false;
  }
  ack.set_transfer_id(transfer.transfer_id());
  if (transfer.transfer_id() == 0) {
    // proto3's default: a message of another type (or none) parses as a
    // transfer without an id; RegisterRegion could never name it sensibly.
    ack.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    ack.set_message(absl::StrCat("SessionFdTransfer.transfer_id is 0 (unset); ids start at 1 (",
                                 n, "-byte message with ", fds.size(), " fd(s) refused)"));
  } else if (fds.size() != 1) {
    ack.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    ack.set_message(absl::StrCat("SessionFdTransfer carries ", fds.size(),
                                 " file descriptors; it needs exactly 1"));
  } else {
    absl::Status st = sessions->AddPendingFd(c.session, transfer.transfer_id(), std::move(fds[0]));
    ack.set_code(static_cast<int>(st.code()));
    ack.set_message(std::string(st.message()));
  }
  return SendProto(c.fd.get(), ack);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SessionSocket>> SessionSocket::Start(std::string path,
                                                                   SessionManager* sessions,
                                                                   uint32_t allowed_uid) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd listen_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listen_fd.valid()) return Errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  unlink(path.c_str());
  const mode_t old_mask = umask(0177);  // the file is created 0600
  const int rc = bind(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (rc != 0) return Errno(absl::StrCat("bind(", path, ")"));
  chmod(path.c_str(), 0600);
  if (listen(listen_fd.get(), 64) != 0) return Errno("listen");
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) return Errno("pipe2");
  return std::unique_ptr<SessionSocket>(new SessionSocket(std::move(path), sessions, allowed_uid,
                                                          std::move(listen_fd), UniqueFd(pipefd[0]),
                                                          UniqueFd(pipefd[1])));
}

SessionSocket::SessionSocket(std::string path, SessionManager* sessions, uint32_t allowed_uid,
                             UniqueFd listen, UniqueFd wake_read, UniqueFd wake_write)
    : path_(std::move(path)),
      sessions_(sessions),
      allowed_uid_(allowed_uid),
      listen_(std::move(listen)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)) {
  thread_ = std::thread([this] { Loop(); });
}

SessionSocket::~SessionSocket() {
  stop_ = true;
  const char b = 1;
  (void)!write(wake_write_.get(), &b, 1);
  thread_.join();
  unlink(path_.c_str());
}

void SessionSocket::Loop() {
  std::map<int, Connection> conns;  // by fd
  while (!stop_) {
    std::vector<pollfd> pfds = {{wake_read_.get(), POLLIN, 0}, {listen_.get(), POLLIN, 0}};
    for (auto& [fd, c] : conns) pfds.push_back({fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      HSAP_LOG(ERROR) << "session socket poll failed: " << strerror(errno);
      break;
    }
    if (pfds[1].revents & POLLIN) {
      UniqueFd fd(accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      struct ucred cred = {};
      socklen_t len = sizeof(cred);
      if (fd.valid() && getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        if (cred.uid != allowed_uid_ && cred.uid != 0) {
          HSAP_LOG(WARNING) << "refused session from pid " << cred.pid << " uid " << cred.uid
                            << " (allowed uid " << allowed_uid_ << ")";
        } else {
          const auto creds = sessions_->Begin(cred.uid, cred.pid);
          hsap::v1::SessionHello hello;
          hello.set_session_id(creds.id);
          hello.set_session_token(creds.token);
          hello.set_daemon_version(kVersion);
          hello.set_protocol_version(kProtocolVersion);
          if (SendProto(fd.get(), hello)) {
            HSAP_LOG(INFO) << "session " << creds.id << " opened by pid " << cred.pid;
            const int raw = fd.get();
            conns[raw] = Connection{std::move(fd), creds.id};
          } else {
            sessions_->End(creds.id);
          }
        }
      }
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      auto it = conns.find(pfds[i].fd);
      bool keep = (pfds[i].revents & POLLIN) && HandleMessage(it->second, sessions_);
      if (!keep) {
        HSAP_LOG(INFO) << "session " << it->second.session << " closed; reclaiming its regions";
        sessions_->End(it->second.session);
        conns.erase(it);
      }
    }
  }
  for (auto& [fd, c] : conns) sessions_->End(c.session);
}

}  // namespace hsap::shm

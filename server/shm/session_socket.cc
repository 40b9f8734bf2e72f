#include "server/shm/session_socket.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/version.h"
#include "hsap/v1/regions.pb.h"
#include "server/shm/region.h"

namespace hsap::shm {
namespace {

constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kMaxMessage = 4096;
constexpr size_t kMaxFdsPerMessage = 4;
constexpr absl::Duration kFirstBackoff = absl::Milliseconds(50);
constexpr absl::Duration kMaxBackoff = absl::Seconds(1);

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(errno)));
}

bool FdLimitErrno(int e) { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }

struct Connection {
  UniqueFd fd;
  uint64_t session = 0;
  std::deque<std::string> out;  // serialized messages the kernel has not taken yet
  bool close_after_flush = false;
  uint32_t events = 0;      // what the epoll set watches now
  uint32_t generation = 0;  // tells a reused fd number's events apart
  // Since when the connection has been throttled without the client taking
  // an ack (InfiniteFuture: not throttled).
  absl::Time stalled_since = absl::InfiniteFuture();
};

uint64_t EventKey(int fd, uint32_t generation) {
  return (static_cast<uint64_t>(generation) << 32) | static_cast<uint32_t>(fd);
}

// What one received message asks for.
struct Answer {
  bool close = false;         // a protocol error or a hang-up: end the session
  std::string ack;            // serialized SessionFdAck, when not closing
};

// True when the process cannot take one more fd now.
bool AtFdLimit(int any_fd) {
  const int probe = fcntl(any_fd, F_DUPFD_CLOEXEC, 0);
  if (probe >= 0) {
    close(probe);
    return false;
  }
  return FdLimitErrno(errno);
}

// Reads one message (with at most kMaxFdsPerMessage fds). *again: nothing
// to read now.
Answer ReadMessage(Connection& c, SessionManager* sessions, bool* again) {
  *again = false;
  char buf[kMaxMessage];
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  struct iovec iov = {buf, sizeof(buf)};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(c.fd.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      *again = true;
      return {};
    }
    return {.close = true};
  }
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
  if (n == 0) return {.close = true};
  hsap::v1::SessionFdTransfer transfer;
  hsap::v1::SessionFdAck ack;
  const bool fd_limit = (msg.msg_flags & MSG_CTRUNC) != 0 && fds.size() < kMaxFdsPerMessage &&
                        AtFdLimit(c.fd.get());
  if ((msg.msg_flags & MSG_TRUNC) != 0 || ((msg.msg_flags & MSG_CTRUNC) != 0 && !fd_limit) ||
      !transfer.ParseFromArray(buf, static_cast<int>(n))) {
    HSAP_LOG(WARNING) << "session " << c.session << ": malformed message of " << n
                      << " bytes; closing it";
    return {.close = true};
  }
  ack.set_transfer_id(transfer.transfer_id());
  if (fd_limit) {
    ack.set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
    ack.set_message(absl::StrCat(
        "the daemon is at its open-file limit (RLIMIT_NOFILE) and could not receive the fd of "
        "transfer ", transfer.transfer_id(), "; retry later"));
  } else if (transfer.transfer_id() == 0) {
    // proto3's default: a message of another type (or none) parses as a
    // transfer without an id; RegisterRegion could never name it sensibly.
    ack.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    ack.set_message(absl::StrCat("SessionFdTransfer.transfer_id is 0 (unset); ids start at 1 (",
                                 n, "-byte message with ", fds.size(), " fd(s) refused)"));
  } else if (fds.size() != 1) {
    ack.set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    ack.set_message(absl::StrCat("SessionFdTransfer carries ", fds.size(),
                                 " file descriptors; it needs exactly 1"));
  } else if (absl::Status kind = CheckRegionFd(fds[0].get()); !kind.ok()) {
    // Refused at once, not kept: a socket kept here (say, the client's own
    // end of this connection) would keep the session alive after the
    // client exits.
    ack.set_code(static_cast<int>(kind.code()));
    ack.set_message(absl::StrCat("transfer ", transfer.transfer_id(), ": ", kind.message()));
  } else {
    absl::Status st = sessions->AddPendingFd(c.session, transfer.transfer_id(), std::move(fds[0]));
    ack.set_code(static_cast<int>(st.code()));
    ack.set_message(std::string(st.message()));
  }
  return {.close = false, .ack = ack.SerializeAsString()};
}

}  // namespace

// The serving thread's state: the epoll set and every connection.
class SessionSocket::Loop {
 public:
  Loop(SessionSocket* owner, UniqueFd epoll) : owner_(owner), epoll_(std::move(epoll)) {}

  void Run() {
    Watch(owner_->wake_read_.get(), EPOLLIN);
    Watch(owner_->listen_.get(), EPOLLIN);
    epoll_event events[64];
    while (!owner_->stop_) {
      int timeout_ms = -1;
      if (!listening_) {
        timeout_ms = static_cast<int>(std::max<int64_t>(
            0, absl::ToInt64Milliseconds(resume_accept_ - absl::Now()) + 1));
      }
      const absl::Time stall_check = CloseStalled();
      if (stall_check != absl::InfiniteFuture()) {
        const int until = static_cast<int>(std::max<int64_t>(
            0, absl::ToInt64Milliseconds(stall_check - absl::Now()) + 1));
        timeout_ms = timeout_ms < 0 ? until : std::min(timeout_ms, until);
      }
      const int n = epoll_wait(epoll_.get(), events, 64, timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        HSAP_LOG(ERROR) << "session socket epoll_wait failed: " << strerror(errno);
        break;
      }
      if (!listening_ && absl::Now() >= resume_accept_) {
        listening_ = true;
        Watch(owner_->listen_.get(), EPOLLIN);
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t key = events[i].data.u64;
        const int fd = static_cast<int>(key & 0xffffffffu);
        if (key == EventKey(owner_->wake_read_.get(), 0)) continue;  // stop_ is checked above
        if (key == EventKey(owner_->listen_.get(), 0)) {
          AcceptSome();
          continue;
        }
        auto it = conns_.find(fd);
        // Closed earlier in this batch (and maybe its number reused since).
        if (it == conns_.end() || EventKey(fd, it->second.generation) != key) continue;
        if (!Serve(it->second, events[i].events)) Close(it);
      }
    }
    for (auto& [fd, c] : conns_) owner_->sessions_->End(c.session);
    conns_.clear();
  }

 private:
  // Closes the connections throttled without progress for the stall
  // timeout; returns when the next one would be due (InfiniteFuture: none
  // is throttled). O(connections), only while some connection is throttled.
  absl::Time CloseStalled() {
    if (!any_throttled_) return absl::InfiniteFuture();
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    any_throttled_ = false;
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto here = it++;
      const absl::Time since = here->second.stalled_since;
      if (since == absl::InfiniteFuture()) continue;
      if (now - since >= owner_->stall_timeout_) {
        HSAP_LOG(WARNING) << "session " << here->second.session << ": the client has taken no "
                          << "acknowledgement for " << absl::FormatDuration(now - since)
                          << " while throttled; closing it";
        Close(here);
        continue;
      }
      any_throttled_ = true;
      next = std::min(next, since + owner_->stall_timeout_);
    }
    return next;
  }

  void Watch(int fd, uint32_t events) {
    epoll_event e = {};
    e.events = events;
    e.data.u64 = EventKey(fd, 0);
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e) != 0 && errno == EEXIST) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &e);
    }
  }

  // What a connection should be watched for: input unless throttled (or
  // closing), output while acks wait.
  void UpdateInterest(Connection& c) {
    if (c.out.size() < static_cast<size_t>(SessionSocket::kMaxQueuedAcks)) {
      c.stalled_since = absl::InfiniteFuture();
    } else if (c.stalled_since == absl::InfiniteFuture()) {
      c.stalled_since = absl::Now();
    }
    if (c.stalled_since != absl::InfiniteFuture()) any_throttled_ = true;
    uint32_t want = EPOLLRDHUP;
    if (!c.close_after_flush && c.out.size() < static_cast<size_t>(kMaxQueuedAcks)) want |= EPOLLIN;
    if (!c.out.empty()) want |= EPOLLOUT;
    if (want == c.events) return;
    epoll_event e = {};
    e.events = want;
    e.data.u64 = EventKey(c.fd.get(), c.generation);
    epoll_ctl(epoll_.get(), c.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &e);
    c.events = want;
  }

  // Sends what the kernel takes; false when the peer is gone.
  bool Flush(Connection& c) {
    while (!c.out.empty()) {
      const std::string& m = c.out.front();
      const ssize_t sent = send(c.fd.get(), m.data(), m.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return true;
        return false;
      }
      c.out.pop_front();  // SOCK_SEQPACKET: a message goes whole or not at all
      c.stalled_since = absl::InfiniteFuture();  // progress
    }
    return !c.close_after_flush;
  }

  // One readiness event of a connection; false: end the session.
  bool Serve(Connection& c, uint32_t events) {
    if (events & (EPOLLERR | EPOLLHUP)) return false;
    if (events & EPOLLOUT) {
      if (!Flush(c)) return false;
    }
    const bool throttled = c.out.size() >= static_cast<size_t>(kMaxQueuedAcks);
    // A peer that shut down its sending side while we wait for it to read
    // would wake this loop forever: end it.
    if ((events & EPOLLRDHUP) && throttled) return false;
    if (events & (EPOLLIN | EPOLLRDHUP)) {
      for (int i = 0; i < kMessagesPerWakeup && c.out.size() < static_cast<size_t>(kMaxQueuedAcks);
           ++i) {
        bool again = false;
        Answer a = ReadMessage(c, owner_->sessions_, &again);
        if (again) break;
        if (a.close) return false;
        c.out.push_back(std::move(a.ack));
        if (!Flush(c)) return false;
      }
    }
    UpdateInterest(c);
    return true;
  }

  void Close(std::map<int, Connection>::iterator it) {
    if (it->second.session != 0) {
      HSAP_LOG(INFO) << "session " << it->second.session << " closed; reclaiming its regions";
      owner_->sessions_->End(it->second.session);
    }
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->first, nullptr);
    conns_.erase(it);
  }

  void AcceptSome() {
    for (int i = 0; i < kMessagesPerWakeup; ++i) {
      UniqueFd fd(accept4(owner_->listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd.valid()) {
        if (FdLimitErrno(errno)) BackOff(errno);
        return;  // EAGAIN: nothing more waits; other errors: the peer gave up
      }
      backoff_ = kFirstBackoff;
      Admit(std::move(fd));
    }
  }

  // Out of fds (or memory): stop watching the listener for a while.
  void BackOff(int error) {
    owner_->accept_backoffs_.fetch_add(1, std::memory_order_relaxed);
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, owner_->listen_.get(), nullptr);
    listening_ = false;
    resume_accept_ = absl::Now() + backoff_;
    if (absl::Now() - last_backoff_log_ > absl::Seconds(10)) {
      HSAP_LOG(WARNING) << "session socket: accept4 failed (" << strerror(error)
                        << "); new sessions wait " << absl::FormatDuration(backoff_)
                        << " (the daemon is at its fd limit; existing sessions keep working)";
      last_backoff_log_ = absl::Now();
    }
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }

  void Admit(UniqueFd fd) {
    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
    if (cred.uid != owner_->allowed_uid_ && cred.uid != 0) {
      HSAP_LOG(WARNING) << "refused session from pid " << cred.pid << " uid " << cred.uid
                        << " (allowed uid " << owner_->allowed_uid_ << ")";
      return;
    }
    hsap::v1::SessionHello hello;
    hello.set_daemon_version(kVersion);
    hello.set_protocol_version(kProtocolVersion);
    Connection c;
    auto creds = owner_->sessions_->Begin(cred.uid, cred.pid);
    if (creds.ok()) {
      hello.set_session_id(creds->id);
      hello.set_session_token(creds->token);
      c.session = creds->id;
      HSAP_LOG(INFO) << "session " << creds->id << " opened by pid " << cred.pid;
    } else {
      hello.set_code(static_cast<int>(creds.status().code()));
      hello.set_message(std::string(creds.status().message()));
      c.close_after_flush = true;
      HSAP_LOG(WARNING) << "refused session from pid " << cred.pid << ": " << creds.status();
    }
    const int raw = fd.get();
    c.fd = std::move(fd);
    c.generation = ++generations_;
    c.out.push_back(hello.SerializeAsString());
    auto it = conns_.emplace(raw, std::move(c)).first;
    if (!Flush(it->second)) {
      Close(it);
      return;
    }
    UpdateInterest(it->second);
  }

  SessionSocket* const owner_;
  UniqueFd epoll_;
  std::map<int, Connection> conns_;  // by fd
  bool listening_ = true;
  bool any_throttled_ = false;  // some connection may be throttled: check stalls
  absl::Time resume_accept_ = absl::InfinitePast();
  absl::Duration backoff_ = kFirstBackoff;
  absl::Time last_backoff_log_ = absl::InfinitePast();
  uint32_t generations_ = 0;  // connections accepted so far (never 0 for one)
};

absl::StatusOr<std::unique_ptr<SessionSocket>> SessionSocket::Start(
    std::string path, SessionManager* sessions, uint32_t allowed_uid,
    absl::Duration stall_timeout) {
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd listen_fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd.valid()) return Errno("socket(AF_UNIX, SOCK_SEQPACKET)");
  unlink(path.c_str());
  const mode_t old_mask = umask(0177);  // the file is created 0600
  const int rc = bind(listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_mask);
  if (rc != 0) return Errno(absl::StrCat("bind(", path, ")"));
  chmod(path.c_str(), 0600);
  if (listen(listen_fd.get(), 128) != 0) return Errno("listen");
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0) return Errno("pipe2");
  UniqueFd wake_read(pipefd[0]), wake_write(pipefd[1]);
  UniqueFd epoll(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return Errno("epoll_create1");
  return std::unique_ptr<SessionSocket>(
      new SessionSocket(std::move(path), sessions, allowed_uid, stall_timeout, std::move(listen_fd),
                        std::move(wake_read), std::move(wake_write), std::move(epoll)));
}

SessionSocket::SessionSocket(std::string path, SessionManager* sessions, uint32_t allowed_uid,
                             absl::Duration stall_timeout, UniqueFd listen, UniqueFd wake_read,
                             UniqueFd wake_write, UniqueFd epoll)
    : path_(std::move(path)),
      sessions_(sessions),
      allowed_uid_(allowed_uid),
      stall_timeout_(stall_timeout),
      listen_(std::move(listen)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)) {
  thread_ = std::thread([this, e = std::make_shared<UniqueFd>(std::move(epoll))]() mutable {
    Loop(this, std::move(*e)).Run();
  });
}

SessionSocket::~SessionSocket() {
  stop_ = true;
  const char b = 1;
  (void)!write(wake_write_.get(), &b, 1);
  if (thread_.joinable()) thread_.join();
  unlink(path_.c_str());
}

}  // namespace hsap::shm

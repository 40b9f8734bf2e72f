// The session socket: a SOCK_SEQPACKET Unix socket (mode 0600) next to the
// gRPC socket, at "<grpc socket>.session". One connection = one session
// (proto/hsap/v1/regions.proto explains the protocol). Here the daemon
//  * checks the peer's uid (SO_PEERCRED) against the allowed uid,
//  * sends SessionHello (or, at the --max_sessions cap, a hello carrying
//    RESOURCE_EXHAUSTED, then closes),
//  * receives memfds (SessionFdTransfer + SCM_RIGHTS) and acknowledges them;
//    an fd that can never be a region (a socket, a pipe, a disk file, ...;
//    region.h CheckRegionFd) is refused INVALID_ARGUMENT and closed at once,
//  * ends the session when the connection closes, for any reason.
//
// One thread serves every connection without ever blocking on one: the
// sockets are non-blocking and multiplexed with epoll (level-triggered).
//  * Fairness: at most kMessagesPerWakeup messages are read from one
//    connection before the others get their turn.
//  * A slow reader is throttled: acks the kernel cannot take yet wait in a
//    per-connection queue; once kMaxQueuedAcks wait, the daemon stops
//    reading that connection until the client reads its acks. Its own
//    sends then block in its kernel buffer; nobody else notices.
//  * A connection throttled without progress (no ack taken by the client)
//    for `stall_timeout` is closed. Without this, a client could pass its
//    own socket in transfers the daemon has stopped reading, then exit:
//    those in-flight fds keep its end open, so the daemon never sees the
//    hang-up and the session (and its regions) would live forever.
//  * At the fd limit (EMFILE/ENFILE/ENOBUFS/ENOMEM from accept4) the
//    listening socket is taken out of the epoll set for a backoff (50 ms,
//    doubling to 1 s, reset by the next successful accept): connections
//    wait in the backlog instead of the thread spinning at 100 % CPU, and
//    existing sessions keep working. An fd that cannot be received for
//    the same reason (MSG_CTRUNC at the limit) is acknowledged
//    RESOURCE_EXHAUSTED and the session stays open.
#ifndef HSAP_SERVER_SHM_SESSION_SOCKET_H_
#define HSAP_SERVER_SHM_SESSION_SOCKET_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "server/shm/session_manager.h"

namespace hsap::shm {

class SessionSocket {
 public:
  static constexpr int kMessagesPerWakeup = 16;
  static constexpr int kMaxQueuedAcks = 64;

  // Binds `path` (removing a stale socket file) with mode 0600 and starts
  // the serving thread. Peers whose uid is neither `allowed_uid` nor 0 are
  // refused (the connection is closed after a log line).
  static absl::StatusOr<std::unique_ptr<SessionSocket>> Start(
      std::string path, SessionManager* sessions, uint32_t allowed_uid,
      absl::Duration stall_timeout = absl::Seconds(30));
  // Stops the thread, ends every session, removes the socket file.
  ~SessionSocket();
  SessionSocket(const SessionSocket&) = delete;
  SessionSocket& operator=(const SessionSocket&) = delete;

  const std::string& path() const { return path_; }

  // Times accept4 failed for lack of fds (or memory) and the listener
  // backed off; for tests and logs.
  uint64_t accept_backoffs() const { return accept_backoffs_.load(std::memory_order_relaxed); }

 private:
  class Loop;
  SessionSocket(std::string path, SessionManager* sessions, uint32_t allowed_uid,
                absl::Duration stall_timeout, UniqueFd listen, UniqueFd wake_read,
                UniqueFd wake_write, UniqueFd epoll);

  const std::string path_;
  SessionManager* const sessions_;
  const uint32_t allowed_uid_;
  const absl::Duration stall_timeout_;
  UniqueFd listen_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accept_backoffs_{0};
  std::thread thread_;
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_SESSION_SOCKET_H_

// The session socket: a SOCK_SEQPACKET Unix socket (mode 0600) next to the
// gRPC socket, at "<grpc socket>.session". One connection = one session
// (proto/hsap/v1/regions.proto explains the protocol). Here the daemon
//  * checks the peer's uid (SO_PEERCRED) against the allowed uid,
//  * sends SessionHello,
//  * receives memfds (SessionFdTransfer + SCM_RIGHTS) and acknowledges them,
//  * ends the session when the connection closes, for any reason.
//
// One thread polls the listening socket and all connections.
#ifndef HSAP_SERVER_SHM_SESSION_SOCKET_H_
#define HSAP_SERVER_SHM_SESSION_SOCKET_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"
#include "server/shm/session_manager.h"

namespace hsap::shm {

class SessionSocket {
 public:
  // Binds `path` (removing a stale socket file) with mode 0600 and starts
  // the polling thread. Peers whose uid is neither `allowed_uid` nor 0 are
  // refused (the connection is closed after a log line).
  static absl::StatusOr<std::unique_ptr<SessionSocket>> Start(std::string path,
                                                              SessionManager* sessions,
                                                              uint32_t allowed_uid);
  // Stops the thread, ends every session, removes the socket file.
  ~SessionSocket();
  SessionSocket(const SessionSocket&) = delete;
  SessionSocket& operator=(const SessionSocket&) = delete;

  const std::string& path() const { return path_; }

 private:
  SessionSocket(std::string path, SessionManager* sessions, uint32_t allowed_uid, UniqueFd listen,
                UniqueFd wake_read, UniqueFd wake_write);
  void Loop();

  const std::string path_;
  SessionManager* const sessions_;
  const uint32_t allowed_uid_;
  UniqueFd listen_;
  UniqueFd wake_read_;
  UniqueFd wake_write_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_SESSION_SOCKET_H_

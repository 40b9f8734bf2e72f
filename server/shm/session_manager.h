// Sessions of local clients: identity, authentication of gRPC calls, and the
// memfds a client has passed but not yet registered.
//
// A session exists exactly as long as the client's connection to the
// session socket (server/shm/session_socket.h). Closing it calls End(),
// which drops the session's regions from the registry.
//
// Thread-safe.
#ifndef HSAP_SERVER_SHM_SESSION_MANAGER_H_
#define HSAP_SERVER_SHM_SESSION_MANAGER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/unique_fd.h"
#include "server/shm/region_registry.h"

namespace hsap::shm {

class SessionManager {
 public:
  // At most this many memfds may wait for RegisterRegion per session.
  static constexpr int kMaxPendingFds = 64;

  // Open sessions at most (hsapd --max_sessions).
  static constexpr int kDefaultMaxSessions = 256;

  explicit SessionManager(RegionRegistry* registry, int max_sessions = kDefaultMaxSessions,
                          LimitRefusalHook on_refusal = nullptr)
      : registry_(registry), max_sessions_(max_sessions), on_refusal_(std::move(on_refusal)) {}
  // Sets the session cap and the refusal hook. REQUIRES: before the
  // session socket starts.
  void Configure(int max_sessions, LimitRefusalHook on_refusal) {
    max_sessions_ = max_sessions;
    on_refusal_ = std::move(on_refusal);
  }
  SessionManager(const SessionManager&) = delete;
  SessionManager& operator=(const SessionManager&) = delete;

  struct Credentials {
    uint64_t id;
    std::string token;  // 32 hex characters from a CSPRNG-seeded generator
  };

  // Opens a session for a peer with uid `uid` / pid `pid`.
  // RESOURCE_EXHAUSTED naming --max_sessions when that many are open.
  absl::StatusOr<Credentials> Begin(uint32_t uid, int32_t pid);

  // Ends a session: closes its pending fds, drops its regions, then runs
  // the close callbacks (outside every lock). Idempotent.
  void End(uint64_t id);

  // `callback(session)` runs after each End of a live session (e.g. the
  // call matcher forgetting the session's groups). Register before the
  // session socket starts; not thread-safe against End.
  void AddCloseCallback(std::function<void(uint64_t session)> callback);

  // UNAUTHENTICATED unless (id, token) names a live session.
  absl::Status Authenticate(uint64_t id, absl::string_view token) const;

  // Stores a passed fd. ALREADY_EXISTS for a reused transfer_id,
  // RESOURCE_EXHAUSTED past kMaxPendingFds, NOT_FOUND for a dead session.
  absl::Status AddPendingFd(uint64_t id, uint64_t transfer_id, UniqueFd fd);

  // Removes and returns a passed fd; NOT_FOUND names the transfer id.
  absl::StatusOr<UniqueFd> TakePendingFd(uint64_t id, uint64_t transfer_id);

  int num_sessions() const;

 private:
  struct Session {
    std::string token;
    uint32_t uid;
    int32_t pid;
    absl::flat_hash_map<uint64_t, UniqueFd> pending_fds;
  };

  RegionRegistry* const registry_;
  int max_sessions_;
  LimitRefusalHook on_refusal_;
  std::vector<std::function<void(uint64_t)>> close_callbacks_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::shm

#endif  // HSAP_SERVER_SHM_SESSION_MANAGER_H_

#include "server/shm/session_manager.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hsap::shm {
namespace {

std::string RandomToken() {
  std::random_device rd;  // /dev/urandom on Linux
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

// Constant-time comparison so a token cannot be guessed byte by byte.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<SessionManager::Credentials> SessionManager::Begin(uint32_t uid, int32_t pid) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) {
    if (on_refusal_) on_refusal_("max_sessions");
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon already has ", sessions_.size(),
        " open sessions, the limit (--max_sessions); close an idle client and retry"));
  }
  const uint64_t id = next_id_++;
  Session& s = sessions_[id];
  s.token = RandomToken();
  s.uid = uid;
  s.pid = pid;
  return Credentials{id, s.token};
}

void SessionManager::AddCloseCallback(std::function<void(uint64_t session)> callback) {
  close_callbacks_.push_back(std::move(callback));
}

void SessionManager::End(uint64_t id) {
  absl::flat_hash_map<uint64_t, UniqueFd> fds;  // closed outside the lock
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    fds = std::move(it->second.pending_fds);
    sessions_.erase(it);
  }
  registry_->DropSession(id);
  for (const auto& callback : close_callbacks_) callback(id);
}

absl::Status SessionManager::Authenticate(uint64_t id, absl::string_view token) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !SameToken(it->second.token, token)) {
    return absl::UnauthenticatedError(absl::StrCat(
        "hsap-session-id ", id, " with the given hsap-session-token is not a live session; "
        "connect to the session socket first"));
  }
  return absl::OkStatus();
}

absl::Status SessionManager::AddPendingFd(uint64_t id, uint64_t transfer_id, UniqueFd fd) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session ", id, " is gone"));
  auto& pending = it->second.pending_fds;
  if (pending.contains(transfer_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer_id ", transfer_id, " already holds an fd in this session"));
  }
  if (pending.size() >= kMaxPendingFds) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", id, " has ", pending.size(), " fds waiting for RegisterRegion, the limit"));
  }
  pending.emplace(transfer_id, std::move(fd));
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> SessionManager::TakePendingFd(uint64_t id, uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session ", id, " is gone"));
  auto fit = it->second.pending_fds.find(transfer_id);
  if (fit == it->second.pending_fds.end()) {
    return absl::NotFoundError(absl::StrCat("memfd.transfer_id ", transfer_id,
                                            " was not passed on this session's socket"));
  }
  UniqueFd fd = std::move(fit->second);
  it->second.pending_fds.erase(fit);
  return fd;
}

int SessionManager::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

}  // namespace hsap::shm

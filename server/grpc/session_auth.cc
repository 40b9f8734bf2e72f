#include "server/grpc/session_auth.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hsap {

absl::StatusOr<uint64_t> SessionOf(const grpc::ServerContext& context,
                                   const shm::SessionManager& sessions) {
  const auto& md = context.client_metadata();
  auto id_it = md.find(kSessionIdHeader);
  auto token_it = md.find(kSessionTokenHeader);
  if (id_it == md.end() || token_it == md.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the call carries no ", kSessionIdHeader, "/", kSessionTokenHeader,
        " metadata; open a session on the session socket first"));
  }
  uint64_t id = 0;
  const absl::string_view id_text(id_it->second.data(), id_it->second.size());
  if (!absl::SimpleAtoi(id_text, &id)) {
    return absl::UnauthenticatedError(
        absl::StrCat(kSessionIdHeader, " '", id_text.substr(0, 32), "' is not a number"));
  }
  const absl::string_view token(token_it->second.data(), token_it->second.size());
  absl::Status st = sessions.Authenticate(id, token);
  if (!st.ok()) return st;
  return id;
}

}  // namespace hsap

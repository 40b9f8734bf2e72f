// Identifies the session of a local gRPC call from its metadata
// (hsap-session-id, hsap-session-token; see proto/hsap/v1/regions.proto).
#ifndef HSAP_SERVER_GRPC_SESSION_AUTH_H_
#define HSAP_SERVER_GRPC_SESSION_AUTH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "server/shm/session_manager.h"

namespace hsap {

inline constexpr char kSessionIdHeader[] = "hsap-session-id";
inline constexpr char kSessionTokenHeader[] = "hsap-session-token";

// UNAUTHENTICATED when the headers are missing, malformed or stale.
absl::StatusOr<uint64_t> SessionOf(const grpc::ServerContext& context,
                                   const shm::SessionManager& sessions);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_SESSION_AUTH_H_

// Who made a gRPC call to hsapd, decided once at the top of every handler.
//
// hsapd serves one gRPC server on two listeners: the Unix socket (mode
// 0600: local trainers and operators of the daemon's uid; calls that touch
// regions authenticate with their session, session_auth.h) and the TCP port
// (peers and operators). With a token (--token_file) every TCP call must
// carry `authorization: Bearer <token>` or it is UNAUTHENTICATED before the
// handler does anything.
//
// Why a check in each handler and not a server interceptor: gRPC C++ (1.51)
// server interceptors cannot end a call — there is no server-side Hijack and
// the handler runs whatever the interceptor does (grpc/grpc#24017).
// tests/integration/tcp_auth_test.cc calls every method of every hsap.v1
// service over TCP without the token, so a new handler that forgets the
// check fails a test. Without TLS the listener's gate (tcp_gate.h) refuses
// the same calls earlier, at their headers, so that a refused caller's
// body is never read; this check stays for TLS listeners and as the
// handlers' own guarantee.
//
//   HSAP_ASSIGN_OR_RETURN_GRPC(Caller caller, AuthorizeCall(*context, token));
#ifndef HSAP_SERVER_GRPC_TCP_AUTH_H_
#define HSAP_SERVER_GRPC_TCP_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/auth_token.h"
#include "grpcpp/server_context.h"

namespace hsap {

enum class Caller {
  kLocal,          // over the Unix socket
  kTcpOpen,        // over TCP, the daemon has no token: no operator rights
  kTcpAuthorized,  // over TCP with the daemon's token: a peer or an operator
};

// `tcp_token` empty: TCP is open (a warning was logged at start-up).
// UNAUTHENTICATED for a TCP call without the right token.
inline absl::StatusOr<Caller> AuthorizeCall(const grpc::ServerContext& context,
                                            const std::string& tcp_token) {
  if (IsUnixSocketCall(context)) return Caller::kLocal;
  if (tcp_token.empty()) return Caller::kTcpOpen;
  absl::Status st = CheckBearerToken(context, tcp_token);
  if (!st.ok()) return st;
  return Caller::kTcpAuthorized;
}

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_TCP_AUTH_H_

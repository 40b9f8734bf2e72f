// The shared token of a cluster's TCP endpoints (DESIGN.md §7: "peers and
// operators: gRPC over TCP, shared token"). Every TCP call carries the
// metadata `authorization: Bearer <token>`; calls over the daemon's Unix
// socket keep the session/uid model and need no token.
//
//   auto token = hsap::ReadTokenFile("/etc/hsap/token");   // refuses mode & 077
//   auto channel = hsap::CreateChannelWithToken("node1:7070", *token);
//   ...server side...
//   if (!hsap::CallCarriesToken(context, expected)) return UNAUTHENTICATED;
//
// Used by hsapd (server/grpc, server/cluster) and by hsapctl.
#ifndef HSAP_COMMON_AUTH_TOKEN_H_
#define HSAP_COMMON_AUTH_TOKEN_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/channel_arguments.h"

namespace hsap {

inline constexpr char kAuthorizationHeader[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";
// Shorter tokens are refused: 16 characters of a random base64/hex string is
// the least that resists guessing over the network.
inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// Reads the token from `path`: the file's content without surrounding
// whitespace. FAILED_PRECONDITION when the file (after following links) is
// accessible to its group or others (mode & 077: "chmod 600"), or the token
// is shorter than kMinTokenBytes or contains whitespace or control
// characters; NOT_FOUND / PERMISSION_DENIED when it cannot be read.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Compares in time that depends only on expected.size(), never on where
// `given` first differs.
bool TokensEqual(absl::string_view given, absl::string_view expected);

// True when the call came over a Unix socket (gRPC peer "unix:...").
bool IsUnixSocketCall(const grpc::ServerContext& context);

// OK when `header`, the value of the call's `authorization` metadata
// (nullptr: none was sent), is `Bearer <expected>`; otherwise
// UNAUTHENTICATED saying what was missing (never the token). Shared by the
// handlers' check below and the TCP listener's gate (server/grpc/tcp_gate.h).
// REQUIRES: !expected.empty().
absl::Status CheckBearerHeader(const absl::string_view* header, absl::string_view expected);

// The refusal of a peer call by a daemon whose TCP port has neither mutual
// TLS nor a token and was not started with --insecure_peers; `self` is its
// advertised address. Given by the listener's gate and the Peer handlers.
absl::Status PeersNeedCredentialsError(absl::string_view self);

// OK when the call's metadata holds `authorization: Bearer <expected>`;
// otherwise UNAUTHENTICATED saying what was missing (never the token).
// REQUIRES: !expected.empty().
absl::Status CheckBearerToken(const grpc::ServerContext& context, absl::string_view expected);

// A channel whose every call carries `authorization: Bearer <token>` (added
// by a client interceptor; nothing is added when `token` is empty).
// Insecure transport credentials: the token authenticates, it does not
// encrypt (deploy/README.md says where TLS or a private network is needed).
std::shared_ptr<grpc::Channel> CreateChannelWithToken(const std::string& target,
                                                      const std::string& token,
                                                      const grpc::ChannelArguments& args = {});

}  // namespace hsap

#endif  // HSAP_COMMON_AUTH_TOKEN_H_

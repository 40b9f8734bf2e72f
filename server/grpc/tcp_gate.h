// The TCP listener's token gate: a call without the daemon's token is
// refused when its headers arrive, before gRPC reads a byte of its body.
//
// The handlers' own check (tcp_auth.h) runs only once gRPC has read and
// parsed the whole request, and gRPC 1.51 opens a stream's flow-control
// window to the size the request announces as soon as the call is matched
// to a method: 12 clients sending 60 MiB ProbeLinks without the token grew
// hsapd by 24-83 MiB under a 16 MiB memory quota before their streams were
// reset (issue 33). The gate is an auth metadata processor on the
// listener's credentials: gRPC's server auth filter runs it on a call's
// initial metadata and, when it refuses, ends the call UNAUTHENTICATED
// before the call is matched, so no request window is opened.
//
// gRPC C++ 1.51 takes an AuthMetadataProcessor only on TLS credentials
// (InsecureServerCredentials()->SetAuthMetadataProcessor asserts); the C
// core takes one on any server credentials, so the gate wraps the core's
// insecure credentials. With mutual TLS (peer_tls.h) a caller without a
// certificate never opens a stream, and no gate is needed.
//
// Health checks and server reflection pass without the token, as they did
// before the gate: a load balancer or kubelet probe carries none.
//
//   tcp.AddListeningPort(address, TokenGatedInsecureCredentials(token));
#ifndef HSAP_SERVER_GRPC_TCP_GATE_H_
#define HSAP_SERVER_GRPC_TCP_GATE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"

namespace hsap {

// The gate's decision for one call: OK, or UNAUTHENTICATED with the
// message the handlers' check would give. `path` is the call's ":path";
// `authorization` its authorization metadata (nullptr: none was sent).
// REQUIRES: !token.empty().
absl::Status TcpGateDecision(absl::string_view path, const absl::string_view* authorization,
                             absl::string_view token);

// Insecure (plain TCP) server credentials whose every call passes
// TcpGateDecision first. REQUIRES: !token.empty().
std::shared_ptr<grpc::ServerCredentials> TokenGatedInsecureCredentials(std::string token);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_TCP_GATE_H_

// The TCP listener's gate: a call that its handler would refuse for want of
// credentials is refused when its headers arrive, before gRPC reads a byte
// of its body.
//
// The handlers' own checks (tcp_auth.h, Cluster::AuthorizePeerCall) run
// only once gRPC has read and parsed the whole request, and gRPC 1.51
// opens a stream's flow-control window to the size the request announces
// as soon as the call is matched to a method: 12 clients sending 60 MiB
// ProbeLinks without the token grew hsapd by 24-83 MiB under a 16 MiB
// memory quota before their streams were reset (issue 33). The gate is an
// auth metadata processor on the listener's credentials: gRPC's server
// auth filter runs it on a call's initial metadata and, when it refuses,
// ends the call before the call is matched, so no request window opens.
//
// What it refuses, by the call's path (the handlers refuse the same, with
// the same words, and keep their checks):
//   * health checks and server reflection: never (a load balancer or a
//     kubelet probe carries no credentials);
//   * hsap.v1.Peer: with TLS, a caller that presented no client
//     certificate (the handshake verified any it presented); without TLS,
//     a call without the token, or, with neither token nor
//     --insecure_peers, every call;
//   * every other service (operators): with a token, a call without it.
//
// gRPC C++ 1.51 takes an AuthMetadataProcessor only on TLS credentials
// (InsecureServerCredentials()->SetAuthMetadataProcessor asserts); the C
// core takes one on any server credentials, so without TLS the gate wraps
// the core's insecure credentials.
//
//   TcpGatePolicy policy{token, /*tls=*/false, insecure_peers, address};
//   tcp.AddListeningPort(address, GatedInsecureCredentials(policy));
//   // or, with TLS:
//   auto creds = tls->ServerCredentials();
//   GateTlsCredentials(*creds, policy);
#ifndef HSAP_SERVER_GRPC_TCP_GATE_H_
#define HSAP_SERVER_GRPC_TCP_GATE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"

namespace hsap {

struct TcpGatePolicy {
  std::string token;            // --token_file's; empty: none
  bool tls = false;             // the listener speaks mutual TLS
  bool insecure_peers = false;  // --insecure_peers
  std::string self;             // --advertise_address, for messages
};

// The gate's decision for one call: OK, or UNAUTHENTICATED saying what was
// missing (never the token). `path` is the call's ":path";
// `authorization` its authorization metadata (nullptr: none was sent);
// `has_client_certificate` whether the TLS handshake verified one.
absl::Status TcpGateDecision(const TcpGatePolicy& policy, absl::string_view path,
                             const absl::string_view* authorization,
                             bool has_client_certificate);

// Plain TCP server credentials whose every call passes TcpGateDecision
// first. REQUIRES: !policy.tls.
std::shared_ptr<grpc::ServerCredentials> GatedInsecureCredentials(TcpGatePolicy policy);

// Puts the gate on TLS server credentials (PeerTls::ServerCredentials()).
// REQUIRES: policy.tls.
void GateTlsCredentials(grpc::ServerCredentials& credentials, TcpGatePolicy policy);

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_TCP_GATE_H_

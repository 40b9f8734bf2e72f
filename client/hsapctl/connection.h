// How hsapctl reaches a running hsapd: the Unix socket by default
// (--socket=/run/hsap/hsapd.sock; the daemon's uid or root), or TCP with the
// shared token (--target=host:port --token_file=...), and how it prints
// answers (--format=table|json).
#ifndef HSAP_CLIENT_HSAPCTL_CONNECTION_H_
#define HSAP_CLIENT_HSAPCTL_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace hsap::hsapctl {

struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  bool over_tcp = false;
  std::string socket_path;  // when !over_tcp
  std::string description;  // "unix:/run/hsap/hsapd.sock" or "tcp host:port"
};

// From --socket / --target / --token_file. INVALID_ARGUMENT for --token_file
// without --target; the token file's own errors (mode, length) otherwise.
absl::StatusOr<Connection> ConnectFromFlags();

// A context with the --timeout_s deadline.
void SetDeadline(grpc::ClientContext* context);

// --format: true for json, false for table ("table" and "text" both mean
// table); INVALID_ARGUMENT for anything else.
absl::StatusOr<bool> JsonFormatFromFlags();

// Proto JSON (field names as in the .proto, defaults printed, 2-space
// indent). 64-bit integers are JSON strings, as proto3 JSON maps them.
std::string ToJson(const google::protobuf::Message& message);

// Prints `status` as "hsapctl: <what>: <CODE>: message" and returns 1.
int Fail(const std::string& what, const absl::Status& status);

}  // namespace hsap::hsapctl

#endif  // HSAP_CLIENT_HSAPCTL_CONNECTION_H_

#include "client/hsapctl/connection.h"

#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth_token.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

ABSL_FLAG(std::string, socket, "/run/hsap/hsapd.sock",
          "daemon commands: hsapd's gRPC Unix socket (used unless --target is given)");
ABSL_FLAG(std::string, target, "",
          "daemon commands: hsapd's TCP endpoint host:port (with --token_file when the daemon "
          "has one)");
ABSL_FLAG(std::string, token_file, "",
          "daemon commands over --target: file holding the shared token (mode 0600 or 0400)");
ABSL_FLAG(int, timeout_s, 10, "daemon commands: deadline of each call, seconds");
// Defined in plan_command.cc; shared by every subcommand.
ABSL_DECLARE_FLAG(std::string, format);

namespace hsap::hsapctl {

absl::StatusOr<Connection> ConnectFromFlags() {
  Connection c;
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (target.empty()) {
    if (!token_file.empty()) {
      return absl::InvalidArgumentError(
          "--token_file is for --target=host:port; the Unix socket needs no token");
    }
    c.socket_path = absl::GetFlag(FLAGS_socket);
    c.description = "unix:" + c.socket_path;
    c.channel = grpc::CreateChannel(c.description, grpc::InsecureChannelCredentials());
    return c;
  }
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> t = ReadTokenFile(token_file);
    if (!t.ok()) return t.status();
    token = std::move(t).value();
  }
  c.over_tcp = true;
  c.description = "tcp " + target;
  c.channel = CreateChannelWithToken(target, token);
  return c;
}

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
}

absl::StatusOr<bool> JsonFormatFromFlags() {
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format == "json") return true;
  if (format == "table" || format == "text") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("--format=", format, ": daemon commands print table or json"));
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "hsapctl: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace hsap::hsapctl

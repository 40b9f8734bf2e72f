#include "server/grpc/tcp_gate.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "common/auth_token.h"

namespace hsap {
namespace {

// Open without the token, as at the handlers (docs/decisions.md, "Health
// and reflection stay open on TCP").
constexpr absl::string_view kOpenPrefixes[] = {
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
};

absl::string_view View(const grpc_slice& s) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                           GRPC_SLICE_LENGTH(s));
}

// The processor's state: the token, owned by the core's credentials (freed
// by Destroy when the listener's credentials go).
void Process(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md, size_t num_md,
             grpc_process_auth_metadata_done_cb done, void* user_data) {
  const std::string& token = *static_cast<const std::string*>(state);
  absl::string_view path;
  std::optional<absl::string_view> authorization;
  for (size_t i = 0; i < num_md; ++i) {
    const absl::string_view key = View(md[i].key);
    if (key == ":path") {
      path = View(md[i].value);
    } else if (key == kAuthorizationHeader && !authorization.has_value()) {
      authorization = View(md[i].value);
    }
  }
  const absl::Status decision =
      TcpGateDecision(path, authorization.has_value() ? &*authorization : nullptr, token);
  // Nothing consumed: the handlers check the same metadata again.
  if (decision.ok()) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    const std::string message(decision.message());
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
  }
}

void Destroy(void* state) { delete static_cast<std::string*>(state); }

class TokenGatedCredentials final : public grpc::ServerCredentials {
 public:
  explicit TokenGatedCredentials(std::string token) : token_(std::move(token)) {}

  // A second processor has no place here: the gate is this class's one.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    grpc_auth_metadata_processor processor;
    processor.process = &Process;
    processor.destroy = &Destroy;
    processor.state = new std::string(token_);
    grpc_server_credentials_set_auth_metadata_processor(creds, processor);
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);  // the server holds its own reference
    return port;
  }

  const std::string token_;
};

}  // namespace

absl::Status TcpGateDecision(absl::string_view path, const absl::string_view* authorization,
                             absl::string_view token) {
  for (absl::string_view open : kOpenPrefixes) {
    if (absl::StartsWith(path, open)) return absl::OkStatus();
  }
  return CheckBearerHeader(authorization, token);
}

std::shared_ptr<grpc::ServerCredentials> TokenGatedInsecureCredentials(std::string token) {
  return std::make_shared<TokenGatedCredentials>(std::move(token));
}

}  // namespace hsap

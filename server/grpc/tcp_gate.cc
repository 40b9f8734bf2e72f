#include "server/grpc/tcp_gate.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/grpc_security_constants.h>
#include <grpc/slice.h>

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "common/auth_token.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace hsap {
namespace {

// Open without credentials, as at the handlers (docs/decisions.md, "Health
// and reflection stay open on TCP").
constexpr absl::string_view kOpenPrefixes[] = {
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
};
constexpr absl::string_view kPeerPrefix = "/hsap.v1.Peer/";
constexpr char kPathKey[] = ":path";

absl::string_view View(const grpc_slice& s) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                           GRPC_SLICE_LENGTH(s));
}

// What the gate reads of a call's initial metadata.
struct CallHeaders {
  absl::string_view path;
  std::optional<absl::string_view> authorization;  // the first one sent

  void See(absl::string_view key, absl::string_view value) {
    if (key == kPathKey) {
      path = value;
    } else if (key == kAuthorizationHeader && !authorization.has_value()) {
      authorization = value;
    }
  }
  absl::Status Decide(const TcpGatePolicy& policy, bool has_client_certificate) const {
    return TcpGateDecision(policy, path, authorization.has_value() ? &*authorization : nullptr,
                           has_client_certificate);
  }
};

// The core's processor over plain TCP; `state` is the policy, freed by
// Destroy when the listener's credentials go.
void ProcessInsecure(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                     size_t num_md, grpc_process_auth_metadata_done_cb done, void* user_data) {
  const TcpGatePolicy& policy = *static_cast<const TcpGatePolicy*>(state);
  CallHeaders headers;
  for (size_t i = 0; i < num_md; ++i) headers.See(View(md[i].key), View(md[i].value));
  const absl::Status decision = headers.Decide(policy, /*has_client_certificate=*/false);
  // Nothing consumed: the handlers check the same metadata again.
  if (decision.ok()) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    const std::string message(decision.message());
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, message.c_str());
  }
}

void DestroyPolicy(void* state) { delete static_cast<TcpGatePolicy*>(state); }

class GatedInsecure final : public grpc::ServerCredentials {
 public:
  explicit GatedInsecure(TcpGatePolicy policy) : policy_(std::move(policy)) {}

  // The gate is this class's one processor.
  void SetAuthMetadataProcessor(
      const std::shared_ptr<grpc::AuthMetadataProcessor>& /*processor*/) override {}

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* creds = grpc_insecure_server_credentials_create();
    grpc_auth_metadata_processor processor;
    processor.process = &ProcessInsecure;
    processor.destroy = &DestroyPolicy;
    processor.state = new TcpGatePolicy(policy_);
    grpc_server_credentials_set_auth_metadata_processor(creds, processor);
    const int port = grpc_server_add_http2_port(server, addr.c_str(), creds);
    grpc_server_credentials_release(creds);  // the server holds its own reference
    return port;
  }

  const TcpGatePolicy policy_;
};

// The C++ processor over TLS. Not blocking: gRPC runs it inline.
class TlsGate final : public grpc::AuthMetadataProcessor {
 public:
  explicit TlsGate(TcpGatePolicy policy) : policy_(std::move(policy)) {}
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    CallHeaders headers;
    for (const auto& [key, value] : md) {
      headers.See(absl::string_view(key.data(), key.size()),
                  absl::string_view(value.data(), value.size()));
    }
    const bool certificate =
        context != nullptr && !context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
    const absl::Status decision = headers.Decide(policy_, certificate);
    if (decision.ok()) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(decision.message()));
  }

 private:
  const TcpGatePolicy policy_;
};

}  // namespace

absl::Status TcpGateDecision(const TcpGatePolicy& policy, absl::string_view path,
                             const absl::string_view* authorization,
                             bool has_client_certificate) {
  for (absl::string_view open : kOpenPrefixes) {
    if (absl::StartsWith(path, open)) return absl::OkStatus();
  }
  if (absl::StartsWith(path, kPeerPrefix)) {
    if (policy.tls) {
      if (has_client_certificate) return absl::OkStatus();
      return absl::UnauthenticatedError(
          "the peer call presented no client certificate: a daemon's peer calls need its "
          "certificate signed by the cluster's CA (--tls_cert/--tls_key/--tls_ca)");
    }
    if (!policy.token.empty()) return CheckBearerHeader(authorization, policy.token);
    if (policy.insecure_peers) return absl::OkStatus();
    return PeersNeedCredentialsError(policy.self);
  }
  if (policy.token.empty()) return absl::OkStatus();
  return CheckBearerHeader(authorization, policy.token);
}

std::shared_ptr<grpc::ServerCredentials> GatedInsecureCredentials(TcpGatePolicy policy) {
  return std::make_shared<GatedInsecure>(std::move(policy));
}

void GateTlsCredentials(grpc::ServerCredentials& credentials, TcpGatePolicy policy) {
  credentials.SetAuthMetadataProcessor(std::make_shared<TlsGate>(std::move(policy)));
}

}  // namespace hsap

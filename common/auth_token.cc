#include "common/auth_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/unique_fd.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

namespace hsap {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::FailedPreconditionError(message);
}

// Adds the authorization header to every call of a channel.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationHeader, *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;  // owned by the factory, which outlives the channel's calls
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat(kBearerPrefix, token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("token file ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("token file ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("token file ", path, " is not a regular file"));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "token file %s has mode %04o: it must not be accessible to its group or others "
        "(chmod 600 %s; in Kubernetes, the Secret volume's defaultMode 0400)",
        path, st.st_mode & 07777, path));
  }
  if (st.st_size > static_cast<off_t>(kMaxTokenBytes) + 64) {
    return absl::FailedPreconditionError(absl::StrCat("token file ", path, " has ", st.st_size,
                                                      " bytes; a token has at most ",
                                                      kMaxTokenBytes));
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = read(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("token file ", path));
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  content.resize(done);
  const std::string token(absl::StripAsciiWhitespace(content));
  if (token.size() < kMinTokenBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "token file ", path, " holds a token of ", token.size(), " characters; at least ",
        kMinTokenBytes, " are needed (e.g. `head -c 32 /dev/urandom | base64`)"));
  }
  for (const char c : token) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return absl::FailedPreconditionError(absl::StrCat(
          "token file ", path, " holds whitespace or non-printable characters inside the token; "
          "gRPC metadata takes printable ASCII only"));
    }
  }
  return token;
}

bool TokensEqual(absl::string_view given, absl::string_view expected) {
  // Every byte of `expected` is visited whatever `given` holds; the length
  // difference is folded into the same accumulator.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0 && !expected.empty();
}

bool IsUnixSocketCall(const grpc::ServerContext& context) {
  return absl::StartsWith(context.peer(), "unix:");
}

absl::Status CheckBearerHeader(const absl::string_view* header, absl::string_view expected) {
  if (header == nullptr) {
    return absl::UnauthenticatedError(
        "a TCP call to hsapd needs the metadata 'authorization: Bearer <token>' (the token of "
        "--token_file); none was sent");
  }
  absl::string_view value = *header;
  if (!absl::ConsumePrefix(&value, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "the authorization metadata is not of the form 'Bearer <token>'");
  }
  if (!TokensEqual(value, expected)) {
    return absl::UnauthenticatedError("the bearer token does not match this daemon's --token_file");
  }
  return absl::OkStatus();
}

absl::Status PeersNeedCredentialsError(absl::string_view self) {
  return absl::UnauthenticatedError(absl::StrCat(
      "hsapd ", self, " takes no peer calls over TCP: it has neither mutual TLS (--tls_cert, "
      "--tls_key, --tls_ca) nor a token (--token_file); start it with --insecure_peers to "
      "accept unauthenticated peers on a trusted network"));
}

absl::Status CheckBearerToken(const grpc::ServerContext& context, absl::string_view expected) {
  const auto& md = context.client_metadata();
  auto it = md.find(kAuthorizationHeader);
  if (it == md.end()) return CheckBearerHeader(nullptr, expected);
  const absl::string_view value(it->second.data(), it->second.size());
  return CheckBearerHeader(&value, expected);
}

std::shared_ptr<grpc::Channel> CreateChannelWithToken(const std::string& target,
                                                      const std::string& token,
                                                      const grpc::ChannelArguments& args) {
  if (token.empty()) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, grpc::InsecureChannelCredentials(), args, std::move(interceptors));
}

}  // namespace hsap

#include "server/grpc/tcp_gate.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace hsap {
namespace {

constexpr char kToken[] = "0123456789abcdef0123";
constexpr char kPeerPath[] = "/hsap.v1.Peer/ProbeLink";
constexpr char kOperatorPath[] = "/hsap.v1.Plans/CompilePlan";

TcpGatePolicy Policy(bool token, bool tls, bool insecure_peers) {
  TcpGatePolicy p;
  if (token) p.token = kToken;
  p.tls = tls;
  p.insecure_peers = insecure_peers;
  p.self = "10.0.0.7:7070";
  return p;
}

absl::Status Decide(const TcpGatePolicy& policy, absl::string_view path,
                    const char* authorization, bool certificate = false) {
  if (authorization == nullptr) return TcpGateDecision(policy, path, nullptr, certificate);
  const absl::string_view value(authorization);
  return TcpGateDecision(policy, path, &value, certificate);
}

const std::string kRight = std::string("Bearer ") + kToken;

TEST(TcpGate, WithATokenTheRightBearerTokenPassesEveryService) {
  const TcpGatePolicy p = Policy(true, false, false);
  EXPECT_TRUE(Decide(p, kPeerPath, kRight.c_str()).ok());
  EXPECT_TRUE(Decide(p, kOperatorPath, kRight.c_str()).ok());
}

TEST(TcpGate, WithATokenAnythingElseIsUnauthenticatedAndSaysWhy) {
  const struct {
    const char* authorization;
    const char* says;
  } cases[] = {
      {nullptr, "none was sent"},
      {"", "not of the form 'Bearer <token>'"},
      {"Basic 0123456789abcdef0123", "not of the form 'Bearer <token>'"},
      {"Bearer 0123456789abcdef012", "does not match"},    // one short
      {"Bearer 0123456789abcdef01234", "does not match"},  // one long
      {"Bearer 0123456789abcdef0124", "does not match"},   // last byte
      {"bearer 0123456789abcdef0123", "not of the form"},  // the scheme's case
  };
  for (bool insecure_peers : {false, true}) {
    const TcpGatePolicy p = Policy(true, false, insecure_peers);
    for (const auto& c : cases) {
      for (const char* path : {kPeerPath, "/hsap.v1.Attention/Forward", kOperatorPath, "", "/"}) {
        const absl::Status s = Decide(p, path, c.authorization);
        EXPECT_TRUE(absl::IsUnauthenticated(s)) << path << " " << s;
        EXPECT_TRUE(absl::StrContains(s.message(), c.says)) << s.message();
        EXPECT_FALSE(absl::StrContains(s.message(), kToken)) << s.message();
      }
    }
  }
}

TEST(TcpGate, HealthChecksAndReflectionPassWithoutCredentials) {
  for (const TcpGatePolicy& p : {Policy(true, false, false), Policy(true, true, false),
                                 Policy(false, false, false)}) {
    EXPECT_TRUE(Decide(p, "/grpc.health.v1.Health/Check", nullptr).ok());
    EXPECT_TRUE(Decide(p, "/grpc.health.v1.Health/Watch", "Bearer wrong").ok());
    EXPECT_TRUE(
        Decide(p, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", nullptr).ok());
  }
  // Only those services: a look-alike prefix is not one.
  const TcpGatePolicy p = Policy(true, false, false);
  EXPECT_FALSE(Decide(p, "/grpc.health.v1.HealthX/Check", nullptr).ok());
  EXPECT_FALSE(Decide(p, "/grpc.health.v1.Health", nullptr).ok());
}

TEST(TcpGate, OverTlsPeerCallsNeedAClientCertificateAndOperatorsTheToken) {
  const TcpGatePolicy p = Policy(true, true, false);
  EXPECT_TRUE(Decide(p, kPeerPath, nullptr, /*certificate=*/true).ok());
  const absl::Status none = Decide(p, kPeerPath, kRight.c_str(), /*certificate=*/false);
  EXPECT_TRUE(absl::IsUnauthenticated(none)) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "presented no client certificate")) << none;
  EXPECT_TRUE(Decide(p, kOperatorPath, kRight.c_str()).ok());
  EXPECT_TRUE(Decide(p, kOperatorPath, kRight.c_str(), true).ok());
  EXPECT_TRUE(absl::IsUnauthenticated(Decide(p, kOperatorPath, nullptr, true)));
  // Without a token, operator calls over TLS are open, as at the handlers.
  EXPECT_TRUE(Decide(Policy(false, true, false), kOperatorPath, nullptr).ok());
}

TEST(TcpGate, WithNeitherTlsNorTokenPeersNeedInsecurePeersAndOperatorsAreOpen) {
  const absl::Status refused = Decide(Policy(false, false, false), kPeerPath, nullptr);
  EXPECT_TRUE(absl::IsUnauthenticated(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "hsapd 10.0.0.7:7070 takes no peer calls"))
      << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "--insecure_peers")) << refused;
  EXPECT_TRUE(Decide(Policy(false, false, true), kPeerPath, nullptr).ok());
  EXPECT_TRUE(Decide(Policy(false, false, false), kOperatorPath, nullptr).ok());
}

}  // namespace
}  // namespace hsap

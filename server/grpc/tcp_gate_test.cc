#include "server/grpc/tcp_gate.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace hsap {
namespace {

constexpr char kToken[] = "0123456789abcdef0123";

absl::Status Decide(absl::string_view path, const char* authorization) {
  if (authorization == nullptr) return TcpGateDecision(path, nullptr, kToken);
  const absl::string_view value(authorization);
  return TcpGateDecision(path, &value, kToken);
}

TEST(TcpGate, TheRightBearerTokenPasses) {
  const std::string header = std::string("Bearer ") + kToken;
  EXPECT_TRUE(Decide("/hsap.v1.Peer/ProbeLink", header.c_str()).ok());
  EXPECT_TRUE(Decide("/hsap.v1.Plans/CompilePlan", header.c_str()).ok());
}

TEST(TcpGate, AnythingElseIsUnauthenticatedAndSaysWhy) {
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
  for (const auto& c : cases) {
    for (const char* path : {"/hsap.v1.Peer/ProbeLink", "/hsap.v1.Attention/Forward", "", "/"}) {
      const absl::Status s = Decide(path, c.authorization);
      EXPECT_TRUE(absl::IsUnauthenticated(s)) << path << " " << s;
      EXPECT_TRUE(absl::StrContains(s.message(), c.says)) << s.message();
      EXPECT_FALSE(absl::StrContains(s.message(), kToken)) << s.message();
    }
  }
}

TEST(TcpGate, HealthChecksAndReflectionPassWithoutTheToken) {
  EXPECT_TRUE(Decide("/grpc.health.v1.Health/Check", nullptr).ok());
  EXPECT_TRUE(
      Decide("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", nullptr).ok());
  EXPECT_TRUE(Decide("/grpc.health.v1.Health/Watch", "Bearer wrong").ok());
  // Only the health service: a look-alike prefix is not it.
  EXPECT_FALSE(Decide("/grpc.health.v1.HealthX/Check", nullptr).ok());
  EXPECT_FALSE(Decide("/grpc.health.v1.Health", nullptr).ok());
}

}  // namespace
}  // namespace hsap

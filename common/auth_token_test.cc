#include "common/auth_token.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace hsap {
namespace {

std::string WriteFile(const std::string& name, const std::string& content, mode_t mode) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  unlink(path.c_str());
  std::ofstream(path) << content;
  chmod(path.c_str(), mode);
  return path;
}

TEST(ReadTokenFile, ReadsAndStripsAPrivateFile) {
  const std::string path = WriteFile("ok", "  0123456789abcdef-XYZ\n", 0600);
  auto token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef-XYZ");
  chmod(path.c_str(), 0400);
  EXPECT_TRUE(ReadTokenFile(path).ok());
}

TEST(ReadTokenFile, RefusesGroupOrWorldAccess) {
  for (mode_t mode : {0640, 0604, 0620, 0602, 0644, 0660}) {
    const std::string path = WriteFile("open", "0123456789abcdef\n", mode);
    auto token = ReadTokenFile(path);
    ASSERT_FALSE(token.ok()) << std::oct << mode;
    EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(token.status().message().find("chmod 600"), std::string::npos)
        << token.status();
  }
}

TEST(ReadTokenFile, RefusesShortOrMalformedTokensAndMissingFiles) {
  auto short_token = ReadTokenFile(WriteFile("short", "abc\n", 0600));
  EXPECT_EQ(short_token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(short_token.status().message().find("at least 16"), std::string::npos);
  auto spaced = ReadTokenFile(WriteFile("spaced", "0123456789 abcdef\n", 0600));
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadTokenFile("/nonexistent/token").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokensEqual, ExactMatchOnly) {
  EXPECT_TRUE(TokensEqual("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("0123456789abcdeF", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("0123456789abcde", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("0123456789abcdef0", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("", "0123456789abcdef"));
  EXPECT_FALSE(TokensEqual("", ""));  // an empty expected token never matches
  // A prefix padded with NULs must not match (the loop pads `given` with 0).
  EXPECT_FALSE(TokensEqual(std::string("ab\0", 3), std::string("ab\0\0", 4)));
}

}  // namespace
}  // namespace hsap

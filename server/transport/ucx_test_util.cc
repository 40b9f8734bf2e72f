#include "server/transport/ucx_test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/transport/ucx_tag.h"

extern char** environ;

namespace hsap::transport::testing {

uint64_t MessageSeed(uint64_t exchange, int32_t src, int32_t dst, int32_t k) {
  return ucx_tag::Mix(exchange * 0x9e3779b97f4a7c15ULL + src * 1000003ULL + dst * 10007ULL + k);
}

void FillPattern(uint64_t seed, void* data, int64_t bytes) {
  auto* out = static_cast<unsigned char*>(data);
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t word = ucx_tag::Mix(seed + static_cast<uint64_t>(i));
    std::memcpy(out + i, &word, 8);
  }
  if (i == bytes) return;  // memcpy to data() of an empty buffer (null) is UB (UBSan)
  const uint64_t tail = ucx_tag::Mix(seed + static_cast<uint64_t>(i));
  std::memcpy(out + i, &tail, static_cast<size_t>(bytes - i));
}

absl::Status CheckPattern(uint64_t seed, const void* data, int64_t bytes) {
  const auto* in = static_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t word = ucx_tag::Mix(seed + static_cast<uint64_t>(i));
    const int64_t n = std::min<int64_t>(8, bytes - i);
    if (std::memcmp(in + i, &word, static_cast<size_t>(n)) != 0) {
      for (int64_t j = 0; j < n; ++j) {
        const auto expected = static_cast<unsigned char>(word >> (8 * j));
        if (in[i + j] != expected) {
          return absl::InternalError(absl::StrCat("byte ", i + j, " of ", bytes, " is ",
                                                  int{in[i + j]}, ", expected ", int{expected}));
        }
      }
    }
  }
  return absl::OkStatus();
}

namespace {

absl::Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("write: ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("side channel read timed out");
    pollfd pfd = {fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (ready < 0 && errno != EINTR) return absl::InternalError("poll failed");
    if (ready <= 0) continue;
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError("side channel closed by the peer");
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteBlob(int fd, const std::string& blob) {
  const uint64_t size = blob.size();
  absl::Status s = WriteAll(fd, &size, sizeof size);
  if (!s.ok()) return s;
  return WriteAll(fd, blob.data(), blob.size());
}

absl::StatusOr<std::string> ReadBlob(int fd, absl::Time deadline) {
  uint64_t size = 0;
  absl::Status s = ReadAll(fd, &size, sizeof size, deadline);
  if (!s.ok()) return s;
  if (size > (1u << 20)) return absl::InternalError(absl::StrCat("blob of ", size, " B"));
  std::string blob(size, '\0');
  s = ReadAll(fd, blob.data(), size, deadline);
  if (!s.ok()) return s;
  return blob;
}

absl::StatusOr<ChildProcess> ChildProcess::Spawn(const std::string& gtest_filter,
                                                 const std::vector<std::string>& extra_env,
                                                 int keep_fd) {
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls (the parent has UCX and test threads).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const std::string& e : extra_env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=" + gtest_filter;
  char* argv[] = {exe.data(), filter.data(), nullptr};
  const int flags = keep_fd >= 0 ? ::fcntl(keep_fd, F_GETFD) : 0;
  if (keep_fd >= 0) ::fcntl(keep_fd, F_SETFD, flags & ~FD_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execve(exe.c_str(), argv, envp.data());
    ::_exit(127);
  }
  if (keep_fd >= 0) ::fcntl(keep_fd, F_SETFD, flags | FD_CLOEXEC);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  return ChildProcess(pid);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    Kill();
    (void)Wait(absl::InfiniteFuture());
  }
}

void ChildProcess::Kill() {
  if (pid_ > 0) ::kill(pid_, SIGKILL);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Time deadline) {
  while (true) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return -WTERMSIG(status);
    }
    if (r < 0 && errno != EINTR) return absl::InternalError("waitpid failed");
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("child still running");
    absl::SleepFor(absl::Milliseconds(5));
  }
}

}  // namespace hsap::transport::testing

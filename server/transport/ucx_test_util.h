// Helpers for the UCX transport tests: deterministic message contents, a
// length-prefixed side channel over a socket (the stand-in for gRPC when
// two test processes exchange worker addresses), and a child process that
// is always reaped.
#ifndef HSAP_SERVER_TRANSPORT_UCX_TEST_UTIL_H_
#define HSAP_SERVER_TRANSPORT_UCX_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsap::transport::testing {

// Fills `data` with the pattern of message (seed), and checks it back.
void FillPattern(uint64_t seed, void* data, int64_t bytes);
// OK, or INTERNAL naming the first differing byte.
absl::Status CheckPattern(uint64_t seed, const void* data, int64_t bytes);
uint64_t MessageSeed(uint64_t exchange, int32_t src, int32_t dst, int32_t k);

// Length-prefixed blobs over a stream socket; reads give up at `deadline`
// (DEADLINE_EXCEEDED) or when the peer closed (UNAVAILABLE).
absl::Status WriteBlob(int fd, const std::string& blob);
absl::StatusOr<std::string> ReadBlob(int fd, absl::Time deadline);

// A child process running this test binary again with `gtest_filter` and
// extra environment variables; SIGKILLed and reaped on destruction if it is
// still running.
class ChildProcess {
 public:
  // `keep_fd` stays open in the child (its number is unchanged).
  static absl::StatusOr<ChildProcess> Spawn(const std::string& gtest_filter,
                                            const std::vector<std::string>& extra_env,
                                            int keep_fd);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  void Kill();
  // Waits until the child exits or the deadline; returns its exit code, or
  // -signal when a signal ended it, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Time deadline);

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
};

}  // namespace hsap::transport::testing

#endif  // HSAP_SERVER_TRANSPORT_UCX_TEST_UTIL_H_

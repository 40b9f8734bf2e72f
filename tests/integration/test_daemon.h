// Test helpers: an in-process hsapd on a fresh short socket path, and an
// hsapd child process (the real binary) that is always killed and reaped.
#ifndef HSAP_TESTS_INTEGRATION_TEST_DAEMON_H_
#define HSAP_TESTS_INTEGRATION_TEST_DAEMON_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/daemon.h"

namespace hsap::testing {

// A fresh directory under /tmp (Unix socket paths must stay under 108
// bytes, which Bazel's TEST_TMPDIR exceeds). Removed with its files.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Starts a Daemon in this process with its socket in a TempDir.
struct InProcessDaemon {
  TempDir dir;
  std::unique_ptr<Daemon> daemon;
  std::string socket() const { return daemon->socket_path(); }
};
std::unique_ptr<InProcessDaemon> StartInProcessDaemon(DaemonOptions options = {});

// The real hsapd binary as a child process. The destructor sends SIGKILL if
// it is still running and reaps it, so no test leaves a process behind.
class DaemonProcess {
 public:
  // Starts `binary` with --socket=<dir>/hsapd.sock plus `flags`, and waits
  // (up to 20 s) until the session socket accepts connections.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& binary,
                                                              std::vector<std::string> flags);
  // The same with the daemon's stdout and stderr appended to `log_file`
  // (read it with ReadLog), and `rlimit_nofile` (> 0) as its RLIMIT_NOFILE,
  // soft and hard, set in the child before exec.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(const std::string& binary,
                                                              std::vector<std::string> flags,
                                                              const std::string& log_file,
                                                              int rlimit_nofile = 0);
  // What the daemon logged so far (empty without a log file).
  std::string ReadLog() const;
  ~DaemonProcess();

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  // Sends `sig`; Wait() reaps and returns the exit status (-1 on timeout).
  void Signal(int sig);
  int Wait(double timeout_seconds);
  // The daemon's /proc/<pid>/maps.
  std::string Maps() const;

 private:
  TempDir dir_;
  pid_t pid_ = -1;
  std::string socket_;
  std::string log_file_;
};

// Path of a runfile such as "server/hsapd" under Bazel, or next to the repo.
std::string Runfile(const std::string& path);

// The real hsapd run with `flags` (space-separated; --socket in a fresh
// TempDir comes first) until it exits, as for flags it must refuse: its
// wait status (-1 when it could not run) and stdout + stderr together.
struct HsapdExit {
  int status = -1;
  std::string output;
};
HsapdExit RunHsapdUntilExit(const std::string& flags);

}  // namespace hsap::testing

#endif  // HSAP_TESTS_INTEGRATION_TEST_DAEMON_H_

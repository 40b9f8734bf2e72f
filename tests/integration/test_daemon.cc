#include "tests/integration/test_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace hsap::testing {

TempDir::TempDir() {
  char tmpl[] = "/tmp/hsap-it-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) std::abort();
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::unique_ptr<InProcessDaemon> StartInProcessDaemon(DaemonOptions options) {
  auto d = std::make_unique<InProcessDaemon>();
  options.socket_path = d->dir.path() + "/hsapd.sock";
  if (options.cpu_threads == 0) options.cpu_threads = 2;
  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    fprintf(stderr, "daemon failed to start: %s\n", daemon.status().ToString().c_str());
    std::abort();
  }
  d->daemon = std::move(daemon).value();
  return d;
}

HsapdExit RunHsapdUntilExit(const std::string& flags) {
  TempDir dir;
  const std::string command = absl::StrCat(Runfile("server/hsapd"), " --socket=", dir.path(),
                                           "/hsapd.sock ", flags, " 2>&1");
  HsapdExit result;
  FILE* out = popen(command.c_str(), "r");
  if (out == nullptr) return result;
  char buf[512];
  while (fgets(buf, sizeof(buf), out) != nullptr) result.output += buf;
  result.status = pclose(out);
  return result;
}

std::string Runfile(const std::string& path) {
  // Under `bazel test` (TEST_SRCDIR), `bazel run` (RUNFILES_DIR, or the
  // runfiles root as working directory), or from the repository root.
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = getenv(var)) {
      const std::string p = absl::StrCat(dir, "/hsap/", path);
      if (access(p.c_str(), X_OK) == 0) return p;
    }
  }
  if (access(path.c_str(), X_OK) == 0) return path;
  return absl::StrCat("bazel-bin/", path);
}

namespace {

bool CanConnect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::string& binary,
                                                                    std::vector<std::string> flags) {
  return Start(binary, std::move(flags), "", 0);
}

std::string DaemonProcess::ReadLog() const {
  if (log_file_.empty()) return "";
  std::ifstream in(log_file_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const std::string& binary,
                                                                    std::vector<std::string> flags,
                                                                    const std::string& log_file,
                                                                    int rlimit_nofile) {
  std::unique_ptr<DaemonProcess> p(new DaemonProcess());
  p->log_file_ = log_file;
  p->socket_ = p->dir_.path() + "/hsapd.sock";
  flags.insert(flags.begin(), "--socket=" + p->socket_);
  flags.insert(flags.begin(), binary);
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  argv.push_back(nullptr);
  p->pid_ = fork();
  if (p->pid_ < 0) return absl::InternalError("fork failed");
  if (p->pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test, even if it dies
    if (!log_file.empty()) {
      const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
    }
    if (rlimit_nofile > 0) {
      struct rlimit limit = {static_cast<rlim_t>(rlimit_nofile),
                             static_cast<rlim_t>(rlimit_nofile)};
      setrlimit(RLIMIT_NOFILE, &limit);
    }
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  // Wait for the session socket; it is bound before gRPC starts and the
  // daemon only logs "serving" after both are up, so poll the gRPC socket too.
  for (int i = 0; i < 400; ++i) {
    int status;
    if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
      p->pid_ = -1;
      return absl::InternalError(absl::StrCat(binary, " exited during start-up, status ", status));
    }
    if (access(p->socket_.c_str(), F_OK) == 0 && CanConnect(p->socket_ + ".session")) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(binary, " did not start within 20 s"));
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void DaemonProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int DaemonProcess::Wait(double timeout_seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string DaemonProcess::Maps() const {
  std::ifstream in(absl::StrCat("/proc/", pid_, "/maps"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace hsap::testing

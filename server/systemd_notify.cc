#include "server/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/unique_fd.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace hsap {

absl::Status SystemdNotify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return absl::OkStatus();
  const size_t len = std::strlen(path);
  sockaddr_un addr{};
  if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET=", path, " is not a socket path"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  UniqueFd fd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
             reinterpret_cast<const sockaddr*>(&addr), addr_len) < 0) {
    return absl::UnavailableError(
        absl::StrCat("sd_notify ", state, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Duration SystemdWatchdogInterval() {
  const char* usec_text = std::getenv("WATCHDOG_USEC");
  uint64_t usec = 0;
  if (usec_text == nullptr || !absl::SimpleAtoi(usec_text, &usec) || usec == 0) {
    return absl::ZeroDuration();
  }
  const char* pid_text = std::getenv("WATCHDOG_PID");
  int64_t pid = 0;
  if (pid_text != nullptr && (!absl::SimpleAtoi(pid_text, &pid) || pid != getpid())) {
    return absl::ZeroDuration();
  }
  return absl::Microseconds(usec);
}

SystemdWatchdog::SystemdWatchdog(const std::string& socket_path) {
  const absl::Duration interval = SystemdWatchdogInterval();
  if (interval <= absl::ZeroDuration()) return;
  const absl::Duration period = interval / 2;
  HSAP_LOG(INFO) << "systemd watchdog every " << period << " (health SERVING on unix:"
                 << socket_path << ")";
  thread_ = std::thread([this, period, socket_path] {
    auto channel =
        grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
    auto health = grpc::health::v1::Health::NewStub(channel);
    do {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + period));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      const grpc::Status s = health->Check(&context, request, &response);
      // Any answer proves the server alive (NOT_SERVING while draining too).
      if (s.ok()) {
        const absl::Status st = SystemdNotify("WATCHDOG=1");
        if (!st.ok()) HSAP_LOG(WARNING) << st;
      } else {
        HSAP_LOG(WARNING) << "watchdog: no health answer (" << s.error_message()
                          << "); not pinging systemd";
      }
    } while (!stop_.WaitForNotificationWithTimeout(period));
  });
}

SystemdWatchdog::~SystemdWatchdog() {
  if (!thread_.joinable()) return;
  stop_.Notify();
  thread_.join();
}

}  // namespace hsap

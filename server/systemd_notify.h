// systemd's readiness and watchdog protocol (sd_notify(3)), spoken directly
// on $NOTIFY_SOCKET: one datagram per state change, no libsystemd needed.
// Outside systemd ($NOTIFY_SOCKET unset) every call is a no-op.
//
//   SystemdNotify("READY=1");                 // serving
//   SystemdWatchdog watchdog(socket_path);    // pings while health answers
//   ...
//   SystemdNotify("STOPPING=1");              // draining
//
// deploy/systemd/hsapd.service runs hsapd with Type=notify and WatchdogSec.
#ifndef HSAP_SERVER_SYSTEMD_NOTIFY_H_
#define HSAP_SERVER_SYSTEMD_NOTIFY_H_

#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace hsap {

// Sends `state` ("READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=...") to
// $NOTIFY_SOCKET (a path, or "@name" for an abstract socket). OK without
// $NOTIFY_SOCKET; an error when the socket is set but cannot be written.
absl::Status SystemdNotify(const std::string& state);

// The watchdog interval systemd asks for: $WATCHDOG_USEC when set, a
// positive number and ($WATCHDOG_PID unset or equal to our pid); else zero.
absl::Duration SystemdWatchdogInterval();

// While alive and the watchdog is enabled, checks every interval/2 that the
// daemon answers grpc.health.v1 Check on unix:<socket_path> (within the half
// interval; SERVING or, while draining, NOT_SERVING) and only then sends
// WATCHDOG=1 — a wedged gRPC server is restarted by systemd, not kept alive
// by a timer. Does nothing when the watchdog is off. Stops in the destructor.
class SystemdWatchdog {
 public:
  explicit SystemdWatchdog(const std::string& socket_path);
  ~SystemdWatchdog();
  SystemdWatchdog(const SystemdWatchdog&) = delete;
  SystemdWatchdog& operator=(const SystemdWatchdog&) = delete;

  bool enabled() const { return thread_.joinable(); }

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace hsap

#endif  // HSAP_SERVER_SYSTEMD_NOTIFY_H_

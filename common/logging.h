// Minimal structured logging to stderr for the daemon and tools.
//
// Abseil 20220623 has no absl/log, so this is the project's one logger:
//   HSAP_LOG(INFO) << "listening on " << path;
// Each line: "I1129 23:59:01.123456 hsapd] message". FATAL aborts after
// logging (for broken invariants only, never for a user's mistake).
#ifndef HSAP_COMMON_LOGGING_H_
#define HSAP_COMMON_LOGGING_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace hsap::logging_internal {

class LogLine {
 public:
  LogLine(char severity, const char* file, int line) : severity_(severity) {
    const char* base = file;
    for (const char* p = file; *p; ++p) if (*p == '/') base = p + 1;
    stream_ << severity << absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(), absl::LocalTimeZone())
            << ' ' << base << ':' << line << "] ";
  }
  ~LogLine() {
    stream_ << '\n';
    const std::string s = stream_.str();
    std::fwrite(s.data(), 1, s.size(), stderr);
    std::fflush(stderr);
    if (severity_ == 'F') std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  char severity_;
  std::ostringstream stream_;
};

}  // namespace hsap::logging_internal

#define HSAP_LOG_SEVERITY_INFO 'I'
#define HSAP_LOG_SEVERITY_WARNING 'W'
#define HSAP_LOG_SEVERITY_ERROR 'E'
#define HSAP_LOG_SEVERITY_FATAL 'F'
#define HSAP_LOG(severity) \
  ::hsap::logging_internal::LogLine(HSAP_LOG_SEVERITY_##severity, __FILE__, __LINE__).stream()

// Aborts with a message when an internal invariant fails. The if/else form
// keeps a following `else` from binding to the macro's `if`.
#define HSAP_CHECK(cond) \
  if (cond) {            \
  } else                 \
    HSAP_LOG(FATAL) << "Check failed: " #cond " "

#endif  // HSAP_COMMON_LOGGING_H_

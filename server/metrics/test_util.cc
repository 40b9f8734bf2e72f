#include "server/metrics/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace hsap::metrics::testing {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<std::string> Dechunk(absl::string_view body) {
  std::string out;
  while (true) {
    const size_t eol = body.find("\r\n");
    if (eol == absl::string_view::npos) return absl::DataLossError("chunk size line missing");
    unsigned long size = 0;
    const std::string size_text(body.substr(0, body.find_first_of(";\r")));
    char* end = nullptr;
    size = std::strtoul(size_text.c_str(), &end, 16);
    if (end == size_text.c_str()) return absl::DataLossError("bad chunk size");
    body.remove_prefix(eol + 2);
    if (size == 0) return out;
    if (body.size() < size + 2) return absl::DataLossError("chunk truncated");
    out.append(body.data(), size);
    body.remove_prefix(size + 2);
  }
}

}  // namespace

std::string HttpResponse::Header(absl::string_view name) const {
  for (absl::string_view line : absl::StrSplit(headers, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)), name)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

absl::StatusOr<HttpResponse> HttpRequest(int port, absl::string_view method,
                                         absl::string_view path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  const std::string request = absl::StrCat(method, " ", path,
                                           " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                           "Connection: close\r\n\r\n");
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
  std::string raw;
  char buf[16384];
  while (true) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("HTTP response not complete in time");
    pollfd p{.fd = fd.get(), .events = POLLIN, .revents = 0};
    const int ready = poll(&p, 1, static_cast<int>(left_ms));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    if (n == 0) break;
    raw.append(buf, n);
  }
  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos) return absl::DataLossError("no end of headers: " + raw);
  const size_t status_end = raw.find("\r\n");
  const std::vector<absl::string_view> status_line =
      absl::StrSplit(absl::string_view(raw).substr(0, status_end), ' ');
  HttpResponse response;
  if (status_line.size() < 2 || !absl::StartsWith(status_line[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status_line[1], &response.status_code)) {
    return absl::DataLossError("bad status line: " + raw.substr(0, status_end));
  }
  response.headers = raw.substr(status_end + 2, header_end - status_end - 2);
  response.body = raw.substr(header_end + 4);
  if (absl::EqualsIgnoreCase(response.Header("Transfer-Encoding"), "chunked")) {
    absl::StatusOr<std::string> body = Dechunk(response.body);
    if (!body.ok()) return body.status();
    response.body = *std::move(body);
  }
  return response;
}

absl::StatusOr<std::string> MakeTempDir(absl::string_view prefix) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string path = absl::StrCat(root != nullptr ? root : "/tmp", "/", prefix, "XXXXXX");
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", path, ": ", std::strerror(errno)));
  }
  return path;
}

absl::StatusOr<std::string> ScrapeMetrics(int port, absl::Duration timeout) {
  auto r = HttpRequest(port, "GET", "/metrics", timeout);
  if (!r.ok()) return r.status();
  if (r->status_code != 200) {
    return absl::UnavailableError(absl::StrCat("/metrics answered ", r->status_code));
  }
  return std::move(r->body);
}

double SampleValue(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(0, line.find(' ')), &value)) return value;
  }
  return -1;
}

double ScrapeSample(int port, absl::string_view series, absl::Duration timeout) {
  auto text = ScrapeMetrics(port, timeout);
  return text.ok() ? SampleValue(*text, series) : -1;
}

absl::StatusOr<PromtoolResult> RunPromtoolCheckMetrics(absl::string_view text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    return absl::NotFoundError(
        "promtool is not installed (Debian package prometheus; run scripts/install_deps.sh)");
  }
  absl::StatusOr<std::string> dir = MakeTempDir("promtool");
  if (!dir.ok()) return dir.status();
  const std::string input = *dir + "/metrics.txt";
  FILE* file = std::fopen(input.c_str(), "w");
  if (file == nullptr) return absl::InternalError("cannot write " + input);
  std::fwrite(text.data(), 1, text.size(), file);
  std::fclose(file);
  const std::string command = absl::StrCat("promtool check metrics < '", input, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("popen promtool failed");
  PromtoolResult result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(input.c_str());
  rmdir(dir->c_str());
  return result;
}

absl::StatusOr<int> PickFreeLoopbackPort() {
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("bind/getsockname: ", std::strerror(errno)));
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace hsap::metrics::testing

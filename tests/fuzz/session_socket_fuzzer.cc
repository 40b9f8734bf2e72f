// Fuzzes the session-socket protocol (server/shm/session_socket.h): one
// SessionSocket serves a SessionManager for the whole run; each input
// opens 1-3 real SOCK_SEQPACKET connections to it and plays a sequence of
// actions on them — messages of fuzzed bytes or well-formed
// SessionFdTransfers, with 0-5 attached fds (sealable and unsealable
// memfds, pipes, the socket itself), bursts sent without reading the acks
// (past the daemon's throttle), reads, half-closes and closes.
//
// Properties: no crash or sanitizer report in the serving thread; every
// connection gets a parsable SessionHello with a live session; each
// message is answered by one SessionFdAck, in order, or the daemon ends
// the session (EOF) — a well-formed transfer with one fd is always acked
// with its own transfer id and OK, ALREADY_EXISTS or RESOURCE_EXHAUSTED;
// once the client side is gone every session ends, and the process holds
// no more fds than before the input (received fds are never leaked).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fd_passing.h"
#include "google/protobuf/stubs/logging.h"
#include "hsap/v1/regions.pb.h"
#include "server/shm/session_socket.h"
#include "tests/fuzz/fuzz_util.h"

namespace hsap::shm {
namespace {

struct Server {
  std::string dir;
  RegionRegistry registry;
  SessionManager sessions{&registry};
  std::unique_ptr<SessionSocket> socket;
  Server() {
    char tmpl[] = "/tmp/hsap-fuzz-session-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    // A short stall timeout: a throttled connection whose client left (its
    // own socket in flight keeps it open) ends within ExpectAllReclaimed's
    // wait.
    auto s = SessionSocket::Start(dir + "/s.sock", &sessions, getuid(), absl::Seconds(1));
    FUZZ_CHECK(s.ok());
    socket = std::move(s).value();
  }
};

Server& S() {
  static Server* s = new Server;  // lives for the process
  return *s;
}

// Fds of this process that the inputs create and the daemon may receive:
// the fuzzer's memfds and sockets (libFuzzer's own pipes and files are
// left out: it opens some between inputs).
int CountFds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(link.c_str(), target, sizeof(target) - 1) <= 0) continue;
      const std::string t = target;
      n += t.rfind("/memfd:fuzz-", 0) == 0 || t.rfind("socket:", 0) == 0;
    }
    closedir(d);
  }
  return n;
}

// What the client expects for one sent message.
struct Expect {
  bool well_formed = false;  // a transfer with an id and exactly one fd
  bool region_fd = true;     // that fd is a memfd (not a pipe or socket)
  uint64_t id = 0;
};

struct Conn {
  UniqueFd fd;
  std::deque<Expect> pending;
  bool closed = false;  // the daemon hung up
};

// Receives one message within `ms`; returns its size, 0 on EOF, -1 on timeout.
// poll is retried on EINTR: libFuzzer's -timeout alarm (SIGALRM every
// timeout/2 + 1 s) interrupts it and is not a timeout of the daemon.
ssize_t Recv(int fd, char* buf, size_t len, int ms) {
  pollfd p = {fd, POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const int left = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               deadline - std::chrono::steady_clock::now()).count()));
    const int r = poll(&p, 1, left);
    if (r == 1) break;
    if (r < 0 && errno == EINTR) continue;
    return -1;
  }
  const ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
  if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : 0;
  return n;
}

// Reads the acks waiting (or, with `wait_ms`, until every expectation is
// met or the daemon hangs up).
void Drain(Conn& c, int wait_ms) {
  char buf[8192];
  while (!c.closed && !c.pending.empty()) {
    const ssize_t n = Recv(c.fd.get(), buf, sizeof(buf), wait_ms);
    if (n < 0) {
      FUZZ_CHECK(wait_ms == 0);  // the daemon must answer or hang up in time
      return;
    }
    if (n == 0) {
      c.closed = true;
      return;
    }
    hsap::v1::SessionFdAck ack;
    FUZZ_CHECK(ack.ParseFromArray(buf, static_cast<int>(n)));
    const Expect e = c.pending.front();
    c.pending.pop_front();
    if (e.well_formed) {
      FUZZ_CHECK(ack.transfer_id() == e.id);
      const auto code = static_cast<absl::StatusCode>(ack.code());
      if (e.region_fd) {
        FUZZ_CHECK(code == absl::StatusCode::kOk || code == absl::StatusCode::kAlreadyExists ||
                   code == absl::StatusCode::kResourceExhausted);
      } else {
        FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument);  // refused at once
      }
    } else {
      FUZZ_CHECK(ack.code() != 0 || ack.transfer_id() != 0);
    }
  }
}

UniqueFd FdOfKind(int kind, int self) {
  switch (kind) {
    case 0: return UniqueFd(memfd_create("fuzz-s", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    case 1: return UniqueFd(memfd_create("fuzz-u", MFD_CLOEXEC));
    case 2: {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0) return UniqueFd();
      close(p[1]);
      return UniqueFd(p[0]);
    }
    default: return UniqueFd(fcntl(self, F_DUPFD_CLOEXEC, 0));
  }
}

void SendOne(Conn& c, FuzzedDataProvider& in) {
  std::string bytes;
  Expect e;
  const bool structured = in.ConsumeBool();
  size_t nfds = in.ConsumeIntegralInRange<size_t>(0, 5);
  if (structured) {
    hsap::v1::SessionFdTransfer t;
    t.set_transfer_id(in.ConsumeIntegralInRange<uint64_t>(0, 80));
    bytes = t.SerializeAsString();
    if (in.ConsumeBool()) nfds = 1;
    e.well_formed = t.transfer_id() != 0 && nfds == 1;
    e.id = t.transfer_id();
  } else {
    bytes = in.ConsumeRandomLengthString(in.ConsumeBool() ? 64 : 6000);
  }
  std::vector<UniqueFd> fds;
  for (size_t i = 0; i < nfds; ++i) {
    const int kind = in.ConsumeIntegralInRange(0, 3);
    e.region_fd = e.region_fd && kind <= 1;
    fds.push_back(FdOfKind(kind, c.fd.get()));
  }
  std::vector<int> raw;
  for (auto& f : fds) {
    if (f.valid()) raw.push_back(f.get());
  }
  if (raw.size() != nfds) e.well_formed = false;
  if (SendWithFds(c.fd.get(), bytes, raw, MSG_DONTWAIT | MSG_NOSIGNAL) ==
      static_cast<ssize_t>(bytes.size())) {
    c.pending.push_back(e);
  }
}

void RunInput(FuzzedDataProvider& in) {
  Server& server = S();
  const std::string path = server.dir + "/s.sock";
  std::vector<Conn> conns(in.ConsumeIntegralInRange<int>(1, 3));
  for (Conn& c : conns) {
    c.fd.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    FUZZ_CHECK(connect(c.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    char buf[4096];
    const ssize_t n = Recv(c.fd.get(), buf, sizeof(buf), 5000);
    FUZZ_CHECK(n > 0);
    hsap::v1::SessionHello hello;
    FUZZ_CHECK(hello.ParseFromArray(buf, static_cast<int>(n)));
    FUZZ_CHECK(hello.code() == 0 && hello.session_id() > 0);
    FUZZ_CHECK(server.sessions.Authenticate(hello.session_id(), hello.session_token()).ok());
  }
  int steps = 0;
  while (in.remaining_bytes() > 0 && ++steps < 200) {
    Conn& c = conns[in.ConsumeIntegralInRange<size_t>(0, conns.size() - 1)];
    if (!c.fd.valid()) continue;
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0:
      case 1: SendOne(c, in); break;
      case 2: {  // a burst nobody reads yet: past the throttle
        hsap::v1::SessionFdTransfer t;
        UniqueFd mfd = FdOfKind(0, c.fd.get());
        const int burst = in.ConsumeIntegralInRange<int>(1, 150);
        for (int i = 0; i < burst && mfd.valid(); ++i) {
          t.set_transfer_id(1000 + i);
          const std::string b = t.SerializeAsString();
          if (SendWithFds(c.fd.get(), b, {mfd.get()}, MSG_DONTWAIT | MSG_NOSIGNAL) !=
              static_cast<ssize_t>(b.size())) {
            break;
          }
          c.pending.push_back({.well_formed = true, .region_fd = true, .id = 1000u + i});
        }
        break;
      }
      case 3: Drain(c, 0); break;
      case 4: shutdown(c.fd.get(), SHUT_WR); Drain(c, 8000); c.fd.reset(); break;
      default: c.fd.reset(); break;  // vanish without reading
    }
  }
  for (Conn& c : conns) {
    if (c.fd.valid()) Drain(c, 8000);
  }
  conns.clear();
}

// Every session ends once its client is gone, and every fd the daemon
// received is closed with it (both happen on the serving thread: wait).
void ExpectAllReclaimed(int baseline) {
  // Generous: the machine may be loaded (other builds); libFuzzer's own
  // -timeout (25 s) bounds an input.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (S().sessions.num_sessions() != 0 || CountFds() > baseline) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "sessions %d, fds %d (baseline %d)\n", S().sessions.num_sessions(),
                   CountFds(), baseline);
    }
    FUZZ_CHECK(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace
}  // namespace hsap::shm

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  hsap::shm::S();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int baseline = -1;
  if (baseline < 0) baseline = hsap::shm::CountFds();
  FuzzedDataProvider in(data, size);
  hsap::shm::RunInput(in);
  hsap::shm::ExpectAllReclaimed(baseline);
  return 0;
}

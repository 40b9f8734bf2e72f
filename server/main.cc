// hsapd: the HSAP per-node daemon. Wiring only: flags -> DaemonOptions,
// signals -> Drain. See README.md and proto/README.md.
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/auth_token.h"
#include "common/logging.h"
#include "common/version.h"
#include "server/daemon.h"
#include "server/systemd_notify.h"

ABSL_FLAG(std::string, socket, "/run/hsap/hsapd.sock",
          "gRPC Unix socket for local trainers (mode 0600); sessions use <socket>.session");
ABSL_FLAG(int, port, 0, "TCP port for peers and operators; 0 = off");
ABSL_FLAG(std::string, host, "127.0.0.1", "TCP address to listen on when --port is set");
ABSL_FLAG(std::string, token_file, "",
          "file holding the shared token that every TCP call (peers, operators) must carry as "
          "'authorization: Bearer <token>'; the file must not be accessible to group or others "
          "(mode 0600/0400). With TLS it authenticates operators only (peers present "
          "certificates); without TLS it also authenticates peers, and crosses the network in "
          "clear text. Empty: no token");
ABSL_FLAG(std::string, tls_cert, "",
          "mutual TLS between daemons: this node's PEM certificate (then any intermediates), "
          "signed by --tls_ca, whose subject alternative names (DNS or IP) name the host of "
          "--advertise_address. With --tls_key and --tls_ca the TCP port speaks TLS only and a "
          "peer's identity is its certificate (deploy/tls/make_certs.sh makes a small CA)");
ABSL_FLAG(std::string, tls_key, "", "the PEM private key of --tls_cert (mode 0600/0400)");
ABSL_FLAG(std::string, tls_ca, "", "the PEM CA certificate(s) every peer's certificate must chain to");
ABSL_FLAG(bool, insecure_peers, false,
          "without TLS and without --token_file, accept peer calls on the TCP port anyway (a "
          "trusted network, or loopback tests); otherwise such a port refuses them");
ABSL_FLAG(int, group_form_timeout_ms, 5000,
          "a group formed at run time whose members have not all joined its root this long after "
          "its first call arrived fails, naming them (or at the call's deadline, if sooner)");
ABSL_FLAG(int, metrics_port, 0,
          "HTTP port serving Prometheus /metrics and the plan viewer (/plans); 0 = off");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "address of the HTTP port (/metrics, /plans); it has no authentication");
ABSL_FLAG(bool, plan_pages, true,
          "serve the plan viewer on the metrics port: /plans (the plan cache) and /plans/<key> "
          "(a plan's page: document boundaries, assignment, statistics; no tensor data)");
ABSL_FLAG(std::string, devices, "cpu:1", "device slots of this node: cpu:N");
ABSL_FLAG(int, cpu_threads, 0, "threads for the CPU kernels; 0 = one per core");
ABSL_FLAG(double, emulate_flops_per_s, 0,
          "emulated clusters only: hold each device slot's attention kernels to this many "
          "FLOP/s of the cost model's count (backward at 2.5x), so ranks sharing cores "
          "compute as separate devices would; 0 = off");
ABSL_FLAG(int, plan_compile_threads, 0,
          "threads compiling one plan (used from 64 ranks; the plan does not depend on it); "
          "0 = one per core, at most 8");
ABSL_FLAG(int64_t, kernel_scratch_cache_bytes, int64_t{64} << 20,
          "free CPU kernel scratch (blocks of 1 MiB or more) kept between calls for the next "
          "to reuse, instead of faulting fresh pages in; 0 = none");
ABSL_FLAG(int64_t, memory_budget_bytes, 0,
          "call memory (accumulators, stage buffers) all calls together may hold; a call that "
          "does not fit is RESOURCE_EXHAUSTED. 0 = half of the machine's memory");
ABSL_FLAG(std::string, profile, "measured",
          "hardware profile of the cost model for every plan this daemon compiles whose request "
          "names none (Attention calls; Plans requests with an empty profile). 'measured': this "
          "daemon's own compute rate per dtype and head dim (a short kernel run the first time a "
          "plan needs it) and, for a multi-node group, its root's rate and measured links to the "
          "members; or a fixed one: h100, h200, cpu-loopback, custom:flops=...,...");
ABSL_FLAG(int, call_deadline_ms, 60000,
          "deadline of a call whose request gives none: every rank must arrive and finish by then");
ABSL_FLAG(std::vector<std::string>, peers, {},
          "optional static cluster: every node's TCP host:port in node order, this node "
          "included (pinned peers). Empty: none; groups form at run time between the daemons "
          "their calls name (CallId.nodes) whenever --port is set");
ABSL_FLAG(int, node_rank, 0, "this node's index in --peers");
ABSL_FLAG(std::string, advertise_address, "",
          "the host:port ranks name this daemon by in CallId.nodes (and peers reach it at); "
          "empty: <--host>:<--port>. With --peers it must equal --peers[--node_rank]");
ABSL_FLAG(int, peer_linger_ms, 5000,
          "a run-time peer no live group uses is released (heartbeats stop, UCX endpoint "
          "closed) after this long");
ABSL_FLAG(std::string, ucx_transports, "",
          "UCX transports between nodes (UCX_TLS syntax, e.g. tcp or posix,sysv,cma,self); "
          "empty: UCX's choice");
ABSL_FLAG(std::string, ucx_rndv_thresh, "",
          "UCX_RNDV_THRESH of the data plane (auto, inf or a size); empty: every message "
          "eager when --ucx_transports (else UCX_TLS) is tcp with only same-node transports "
          "besides (a rendezvous' handshakes queue behind bulk data on a TCP connection), "
          "UCX's own threshold otherwise. The environment's UCX_RNDV_THRESH wins");
ABSL_FLAG(int, heartbeat_ms, 200, "heartbeat period between nodes");
ABSL_FLAG(int, peer_down_ms, 1000, "a node silent this long is down: its calls are aborted");
ABSL_FLAG(int, drain_timeout_s, 30, "on SIGTERM/SIGINT, wait this long for calls in flight");
// Caps (docs/reliability.md): each refuses with RESOURCE_EXHAUSTED naming
// the flag, and is exported as hsap_limit{limit="<flag>"}.
ABSL_FLAG(int, max_sessions, 256, "open client sessions at most");
ABSL_FLAG(uint64_t, max_regions_per_session, 1024, "registered regions per session at most");
ABSL_FLAG(uint64_t, max_regions, 16384, "registered regions across sessions at most");
ABSL_FLAG(uint64_t, max_region_bytes_per_session, uint64_t{1} << 38,
          "registered bytes per session at most (default 256 GiB)");
ABSL_FLAG(uint64_t, max_region_bytes, uint64_t{1} << 40,
          "registered bytes across sessions at most (default 1 TiB)");
ABSL_FLAG(uint64_t, max_region_mappings, 0,
          "client mappings at most (regions, and unregistered ones calls still use); 0: half of "
          "vm.max_map_count, leaving the rest to the daemon's own mappings");
ABSL_FLAG(int, max_call_groups, 4096,
          "call groups the call matcher keeps state for at most (and multi-node groups the "
          "peer layer forms)");
ABSL_FLAG(int, max_peers, 1024, "run-time peers (other members of this daemon's groups) at most");
ABSL_FLAG(int, session_stall_timeout_s, 30,
          "a session connection throttled this long without its client reading an ack is closed");
ABSL_FLAG(int, call_group_idle_s, 600,
          "a call group unused this long is released even while its sessions live");
ABSL_FLAG(int, metrics_threads, 8, "/metrics worker threads (slow clients up to this many delay nobody)");
ABSL_FLAG(int, metrics_request_timeout_ms, 2000,
          "/metrics drops a connection whose request does not progress for this long");

namespace {

// Regions of unsealed objects, pending fds and sessions each hold an fd:
// take the hard RLIMIT_NOFILE (systemd's default soft limit is 1,024).
void RaiseOpenFileLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    HSAP_LOG(INFO) << "open-file limit raised from " << before << " to " << limit.rlim_cur;
  }
}

bool ParseDevices(const std::string& text, int* cpu) {
  absl::string_view rest = text;
  return absl::ConsumePrefix(&rest, "cpu:") && absl::SimpleAtoi(rest, cpu);
}

}  // namespace

int main(int argc, char** argv) {
  // A call's buffers (MBs) are freed at its end. glibc raises its mmap
  // threshold after such a free, so later buffers come from the calling
  // thread's arena, which keeps the pages: resident memory grew 20-30% over
  // load_test's run. A fixed threshold returns them to the system at free.
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  absl::SetProgramUsageMessage(
      absl::StrCat("hsapd ", hsap::kVersion, ": exact packed attention as a per-node service"));
  absl::ParseCommandLine(argc, argv);
  // Signals are taken synchronously by the main thread below; every thread
  // started from here on inherits the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  hsap::DaemonOptions options;
  options.socket_path = absl::GetFlag(FLAGS_socket);
  options.tcp_port = absl::GetFlag(FLAGS_port);
  options.tcp_host = absl::GetFlag(FLAGS_host);
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.insecure_peers = absl::GetFlag(FLAGS_insecure_peers);
  options.group_form_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_group_form_timeout_ms));
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.plan_pages = absl::GetFlag(FLAGS_plan_pages);
  options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.kernel_scratch_cache_bytes = absl::GetFlag(FLAGS_kernel_scratch_cache_bytes);
  options.emulate_flops_per_s = absl::GetFlag(FLAGS_emulate_flops_per_s);
  options.plan_compile_threads = absl::GetFlag(FLAGS_plan_compile_threads);
  options.call_deadline = absl::Milliseconds(absl::GetFlag(FLAGS_call_deadline_ms));
  options.profile = absl::GetFlag(FLAGS_profile);
  options.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  options.peers = absl::GetFlag(FLAGS_peers);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.peer_linger = absl::Milliseconds(absl::GetFlag(FLAGS_peer_linger_ms));
  options.max_peers = absl::GetFlag(FLAGS_max_peers);
  options.ucx_transports = absl::GetFlag(FLAGS_ucx_transports);
  options.ucx_rndv_thresh = absl::GetFlag(FLAGS_ucx_rndv_thresh);
  options.heartbeat_period = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.peer_down_after = absl::Milliseconds(absl::GetFlag(FLAGS_peer_down_ms));
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.region_limits.max_regions_per_session = absl::GetFlag(FLAGS_max_regions_per_session);
  options.region_limits.max_regions = absl::GetFlag(FLAGS_max_regions);
  options.region_limits.max_bytes_per_session = absl::GetFlag(FLAGS_max_region_bytes_per_session);
  options.region_limits.max_total_bytes = absl::GetFlag(FLAGS_max_region_bytes);
  options.region_limits.max_mappings = absl::GetFlag(FLAGS_max_region_mappings);
  options.max_call_groups = absl::GetFlag(FLAGS_max_call_groups);
  options.session_stall_timeout = absl::Seconds(absl::GetFlag(FLAGS_session_stall_timeout_s));
  options.call_group_idle = absl::Seconds(absl::GetFlag(FLAGS_call_group_idle_s));
  options.metrics_threads = absl::GetFlag(FLAGS_metrics_threads);
  options.metrics_request_timeout_ms = absl::GetFlag(FLAGS_metrics_request_timeout_ms);
  RaiseOpenFileLimit();
  if (const std::string token_file = absl::GetFlag(FLAGS_token_file); !token_file.empty()) {
    auto token = hsap::ReadTokenFile(token_file);
    if (!token.ok()) {
      HSAP_LOG(ERROR) << "hsapd refuses to start: --token_file: " << token.status();
      return 1;
    }
    options.tcp_token = std::move(token).value();
  }
  if (!ParseDevices(absl::GetFlag(FLAGS_devices), &options.cpu_devices)) {
    HSAP_LOG(ERROR) << "--devices=" << absl::GetFlag(FLAGS_devices)
                    << " is not of the form cpu:N (GPU slots need a CUDA build)";
    return 2;
  }
  if (!(options.emulate_flops_per_s >= 0) || !std::isfinite(options.emulate_flops_per_s)) {
    HSAP_LOG(ERROR) << "--emulate_flops_per_s=" << options.emulate_flops_per_s
                    << " must be a finite number >= 0";
    return 2;
  }
  const std::string dir = options.socket_path.substr(0, options.socket_path.rfind('/'));
  if (!dir.empty() && mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    HSAP_LOG(ERROR) << "cannot create " << dir << ": " << strerror(errno);
    return 1;
  }
  auto daemon = hsap::Daemon::Start(options);
  if (!daemon.ok()) {
    HSAP_LOG(ERROR) << "hsapd failed to start: " << daemon.status();
    return 1;
  }
  // Under systemd (Type=notify): ready now, and a watchdog while we live.
  if (absl::Status st = hsap::SystemdNotify("READY=1\nSTATUS=serving"); !st.ok()) {
    HSAP_LOG(WARNING) << st;
  }
  int sig = 0;
  {
    hsap::SystemdWatchdog watchdog(options.socket_path);
    sigwait(&signals, &sig);
    HSAP_LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (void)hsap::SystemdNotify("STOPPING=1\nSTATUS=draining");
    (*daemon)->Drain(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
  }
  return 0;
}

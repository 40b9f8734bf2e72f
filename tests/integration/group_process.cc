#include "tests/integration/group_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tests/integration/test_daemon.h"

extern char** environ;

namespace hsap::testing {
namespace {

// Variables a child must not inherit: it would overwrite the parent's
// test.xml, or remove its premature-exit marker, or shard itself.
bool InheritedByChild(const char* entry) {
  for (const char* name : {"XML_OUTPUT_FILE=", "GTEST_OUTPUT=", "TEST_PREMATURE_EXIT_FILE=",
                           "TEST_SHARD_STATUS_FILE=", "GTEST_SHARD_INDEX=",
                           "GTEST_TOTAL_SHARDS=", "HSAP_TEST_GROUP_CHILD_SPEC="}) {
    if (std::strncmp(entry, name, std::strlen(name)) == 0) return false;
  }
  return true;
}

std::string OneLine(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"\n", " "}, {"\r", " "}});
}

std::string StatusLine(const absl::Status& s) {
  return absl::StrCat(static_cast<int>(s.code()), " ", OneLine(s.message()));
}

absl::Status ParseStatus(absl::string_view rest) {
  std::pair<std::string, std::string> parts = absl::StrSplit(rest, absl::MaxSplits(' ', 1));
  int code = 0;
  if (!absl::SimpleAtoi(parts.first, &code)) return absl::InternalError("unreadable status");
  return absl::Status(static_cast<absl::StatusCode>(code), parts.second);
}

std::string Tail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  return text.size() <= bytes ? text : text.substr(text.size() - bytes);
}

absl::Status WriteSpec(const std::string& path, const std::vector<int64_t>& cu_seqlens,
                       bool causal, uint64_t seed, const GroupSpec& spec) {
  if (spec.sockets.size() != static_cast<size_t>(spec.nodes) ||
      (!spec.member_addresses.empty() && spec.member_addresses.size() != spec.sockets.size())) {
    return absl::InvalidArgumentError("spec: one socket (and address) per group node");
  }
  std::ofstream out(path);
  out << "group " << spec.group << "\n"
      << "devices_per_node " << spec.devices_per_node << "\n"
      << "strategy " << static_cast<int>(spec.strategy) << "\n"
      << "deadline_ms " << spec.deadline_ms << "\n"
      << "missing_rank " << spec.missing_rank << "\n"
      << "seed " << seed << "\n"
      << "causal " << (causal ? 1 : 0) << "\n"
      << "cu " << absl::StrJoin(cu_seqlens, " ") << "\n";
  for (size_t n = 0; n < spec.sockets.size(); ++n) {
    out << "node " << spec.sockets[n] << " "
        << (spec.member_addresses.empty() ? "-" : spec.member_addresses[n]) << "\n";
  }
  out.close();
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

template <typename T>
bool ParseNumbers(absl::string_view text, std::vector<T>* out) {
  for (absl::string_view piece : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(piece, &v)) return false;
    out->push_back(static_cast<T>(v));
  }
  return true;
}

absl::StatusOr<ChildGroupResult> ReadResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InternalError(absl::StrCat("no result file ", path));
  ChildGroupResult r;
  bool have_status = false;
  std::string line;
  while (std::getline(in, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::string& v = kv.second;
    if (kv.first == "status") {
      r.status = ParseStatus(v);
      have_status = true;
    } else if (kv.first == "caller") {
      r.callers.push_back(ParseStatus(v));
    } else if (kv.first == "max_error") {
      if (!absl::SimpleAtod(v, &r.max_error)) return absl::InternalError("bad max_error");
    } else if (kv.first == "strategies") {
      if (!ParseNumbers(v, &r.strategies_run)) return absl::InternalError("bad strategies");
    } else if (kv.first == "bytes_received") {
      if (!ParseNumbers(v, &r.bytes_received)) return absl::InternalError("bad bytes_received");
    }
  }
  if (!have_status) return absl::InternalError(absl::StrCat("result file ", path, " has no status"));
  return r;
}

}  // namespace

absl::StatusOr<ChildGroupResult> RunGroupInChild(const std::vector<int64_t>& cu_seqlens,
                                                 bool causal, uint64_t seed,
                                                 const GroupSpec& spec,
                                                 const std::string& child_test,
                                                 absl::Duration limit) {
  TempDir dir;
  const std::string spec_path = dir.path() + "/spec", result_path = dir.path() + "/result";
  const std::string log_path = dir.path() + "/child.log";
  if (absl::Status s = WriteSpec(spec_path, cu_seqlens, causal, seed, spec); !s.ok()) return s;

  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (InheritedByChild(*e)) env_strings.push_back(*e);
  }
  env_strings.push_back(absl::StrCat(kGroupChildSpecEnv, "=", spec_path));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=" + child_test;
  std::vector<char*> argv = {exe.data(), filter.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("posix_spawn: ", std::strerror(rc)));

  const absl::Time end = absl::Now() + limit;
  int wstatus = 0;
  for (;;) {
    const pid_t got = waitpid(pid, &wstatus, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) return absl::InternalError("waitpid failed");
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      return absl::DeadlineExceededError(absl::StrCat("group '", spec.group, "' child outlived ",
                                                      absl::FormatDuration(limit), ":\n",
                                                      Tail(log_path, 2000)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::InternalError(absl::StrCat("group '", spec.group, "' child ended with status ",
                                            wstatus, ":\n", Tail(log_path, 4000)));
  }
  absl::StatusOr<ChildGroupResult> r = ReadResult(result_path);
  if (!r.ok()) return absl::InternalError(absl::StrCat(r.status().message(), ":\n",
                                                       Tail(log_path, 2000)));
  return r;
}

absl::Status RunGroupChild() {
  const char* spec_path = std::getenv(kGroupChildSpecEnv);
  if (spec_path == nullptr) return absl::FailedPreconditionError("not a group child process");
  std::ifstream in(spec_path);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", spec_path));
  GroupSpec spec;
  std::vector<int64_t> cu;
  uint64_t seed = 0;
  bool causal = true;
  std::string line;
  while (std::getline(in, line)) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    const std::string& v = kv.second;
    bool ok = true;
    int64_t n = 0;
    if (kv.first == "group") {
      spec.group = v;
    } else if (kv.first == "cu") {
      ok = ParseNumbers(v, &cu);
    } else if (kv.first == "node") {
      std::pair<std::string, std::string> sa = absl::StrSplit(v, absl::MaxSplits(' ', 1));
      spec.sockets.push_back(sa.first);
      if (sa.second != "-") spec.member_addresses.push_back(sa.second);
    } else if ((ok = absl::SimpleAtoi(v, &n))) {
      if (kv.first == "devices_per_node") spec.devices_per_node = static_cast<int32_t>(n);
      if (kv.first == "strategy") spec.strategy = static_cast<hsap::v1::Strategy>(n);
      if (kv.first == "deadline_ms") spec.deadline_ms = static_cast<uint32_t>(n);
      if (kv.first == "missing_rank") spec.missing_rank = static_cast<int32_t>(n);
      if (kv.first == "seed") seed = static_cast<uint64_t>(n);
      if (kv.first == "causal") causal = n != 0;
    }
    if (!ok) return absl::InternalError(absl::StrCat("bad spec line '", line, "'"));
  }
  spec.nodes = static_cast<int32_t>(spec.sockets.size());
  std::vector<absl::Status> callers;
  spec.statuses = &callers;
  const GlobalProblem p = MakeProblem(cu, causal, seed);
  absl::StatusOr<GroupResult> r = RunGroup(p, spec);

  const std::string result_path = (std::string(spec_path).substr(
                                       0, std::string(spec_path).rfind('/'))) + "/result";
  std::ofstream out(result_path);
  out << "status " << StatusLine(r.status()) << "\n";
  for (const absl::Status& s : callers) out << "caller " << StatusLine(s) << "\n";
  if (r.ok()) {
    std::vector<int> strategies(r->strategies_run.begin(), r->strategies_run.end());
    char max_error[32];
    std::snprintf(max_error, sizeof(max_error), "%.17g", r->max_error);
    out << "max_error " << max_error << "\n"
        << "strategies " << absl::StrJoin(strategies, " ") << "\n"
        << "bytes_received " << absl::StrJoin(r->bytes_received, " ") << "\n";
  }
  out.close();
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", result_path));
}

}  // namespace hsap::testing

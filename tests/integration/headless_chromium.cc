#include "tests/integration/headless_chromium.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/integration/test_daemon.h"

namespace hsap::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs chromium with the common flags plus `args`, stdout and stderr into
// files of a fresh directory that also holds the profile and HOME.
absl::StatusOr<ChromiumRun> Run(const std::vector<std::string>& args, absl::Duration timeout) {
  absl::StatusOr<std::string> binary = ChromiumBinary();
  if (!binary.ok()) return binary.status();
  TempDir dir;
  const std::string profile = dir.path() + "/profile", home = dir.path() + "/home";
  mkdir(profile.c_str(), 0700);
  mkdir(home.c_str(), 0700);
  std::vector<std::string> argv = {
      *binary,
      "--headless",
      "--no-sandbox",  // as root
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-default-apps",
      "--disable-extensions",
      "--hide-scrollbars",
      "--enable-logging=stderr",
      "--v=0",
      "--user-data-dir=" + profile,
  };
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string out_path = dir.path() + "/stdout", err_path = dir.path() + "/stderr";
  const absl::Time start = absl::Now();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int in = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    setenv("HOME", home.c_str(), 1);
    setenv("XDG_CONFIG_HOME", home.c_str(), 1);
    setenv("XDG_CACHE_HOME", home.c_str(), 1);
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // either side may win the race; both set the same group
  int status = 0;
  bool exited = false;
  const absl::Time deadline = start + timeout;
  while (absl::Now() < deadline) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      exited = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The browser's helpers share its process group: none outlives the run.
  kill(-pid, SIGKILL);
  if (!exited) waitpid(pid, &status, 0);
  ChromiumRun run;
  run.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  run.dom = ReadAll(out_path);
  run.log = ReadAll(err_path);
  for (absl::string_view line : absl::StrSplit(run.log, '\n')) {
    if (absl::StrContains(line, ":CONSOLE")) run.console.emplace_back(line);
  }
  const std::string tail = run.log.substr(run.log.size() > 2000 ? run.log.size() - 2000 : 0);
  if (!exited) {
    return absl::DeadlineExceededError(
        absl::StrCat("chromium ran past ", absl::FormatDuration(timeout), "; log:\n", tail));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("chromium exited with status ", status,
                                            "; log:\n", tail));
  }
  return run;
}

}  // namespace

absl::StatusOr<std::string> ChromiumBinary() {
  const char* env = std::getenv("HSAP_CHROMIUM");
  const std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/chromium";
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        path, " is not installed: apt-get install chromium (scripts/install_deps.sh)"));
  }
  return path;
}

absl::StatusOr<ChromiumRun> DumpDom(const std::string& url, absl::Duration timeout) {
  return Run({"--window-size=1400,1000", "--dump-dom", url}, timeout);
}

absl::StatusOr<ChromiumRun> Screenshot(const std::string& url, const std::string& png_path,
                                       int width, int height, absl::Duration timeout) {
  unlink(png_path.c_str());
  absl::StatusOr<ChromiumRun> run =
      Run({absl::StrCat("--window-size=", width, ",", height), "--screenshot=" + png_path, url},
          timeout);
  if (!run.ok()) return run;
  struct stat st;
  if (stat(png_path.c_str(), &st) != 0 || st.st_size == 0) {
    return absl::NotFoundError(absl::StrCat("chromium wrote no screenshot ", png_path,
                                            "; log:\n", run->log));
  }
  return run;
}

std::string ErrorsElement(const std::string& dom) {
  const size_t at = dom.find("<pre id=\"errors\"");
  if (at == std::string::npos) return "<no errors element>";
  const size_t gt = dom.find('>', at);
  const size_t end = dom.find("</pre>", gt);
  if (gt == std::string::npos || end == std::string::npos) return "<malformed errors element>";
  return dom.substr(gt + 1, end - gt - 1);
}

std::string ElementTextById(const std::string& dom, const std::string& id) {
  const size_t at = dom.find(absl::StrCat(" id=\"", id, "\""));
  if (at == std::string::npos) return "";
  const size_t gt = dom.find('>', at);
  const size_t end = dom.find("</", gt);
  if (gt == std::string::npos || end == std::string::npos) return "";
  return dom.substr(gt + 1, end - gt - 1);
}

}  // namespace hsap::testing

#include "common/workload.h"

#include <unistd.h>

#include <fstream>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hsap {

absl::StatusOr<std::vector<int64_t>> LoadDocumentLengths(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("workload file '", path, "' cannot be read"));
  std::vector<int64_t> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    absl::string_view s = absl::StripAsciiWhitespace(line);
    if (s.empty() || s[0] == '#') continue;
    int64_t v;
    if (!absl::SimpleAtoi(s, &v) || v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", n, ": '", s.substr(0, 40), "' is not a positive length"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no lengths"));
  return out;
}

std::vector<std::vector<int64_t>> PackDocuments(const std::vector<int64_t>& lengths,
                                                int64_t tokens_per_pack, int num_packs,
                                                uint64_t seed) {
  std::vector<int64_t> order = lengths;
  std::mt19937_64 rng(seed);
  // Fisher-Yates with our own draws, so the packing is the same everywhere.
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  std::vector<std::vector<int64_t>> packs;
  size_t next = 0;
  int64_t carried = 0;  // tokens of the current document not yet placed
  for (int p = 0; p < num_packs; ++p) {
    std::vector<int64_t> cu = {0};
    int64_t filled = 0;
    while (filled < tokens_per_pack) {
      if (carried == 0) {
        carried = order[next];
        next = (next + 1) % order.size();
      }
      const int64_t take = std::min(carried, tokens_per_pack - filled);
      filled += take;
      carried -= take;
      cu.push_back(filled);
    }
    packs.push_back(std::move(cu));
  }
  return packs;
}

std::string FindWorkload(const std::string& file_name) {
  std::vector<std::string> candidates;
  if (const char* env = getenv("HSAP_WORKLOADS")) candidates.push_back(absl::StrCat(env, "/", file_name));
  // Under `bazel test` / `bazel run`: the runfiles tree of a target that
  // depends on //workloads.
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* root = getenv(var)) {
      candidates.push_back(absl::StrCat(root, "/hsap/workloads/", file_name));
    }
  }
  // Next to a binary built by Bazel (bazel-bin/x/y.runfiles/hsap/workloads).
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    candidates.push_back(absl::StrCat(exe, ".runfiles/hsap/workloads/", file_name));
  }
  // `bazel run` sets the workspace; otherwise the repository root is the
  // working directory or one of the folders above it.
  if (const char* root = getenv("BUILD_WORKSPACE_DIRECTORY")) {
    candidates.push_back(absl::StrCat(root, "/workloads/", file_name));
  }
  std::string up = "";
  for (int i = 0; i < 8; ++i) {
    candidates.push_back(absl::StrCat(up, "workloads/", file_name));
    up += "../";
  }
  for (const std::string& c : candidates) {
    if (access(c.c_str(), R_OK) == 0) return c;
  }
  return absl::StrCat("workloads/", file_name);
}

}  // namespace hsap

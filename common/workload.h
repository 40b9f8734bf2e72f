// Real document-length workloads (workloads/*.tokens in the repository: one length
// per line) and the pretraining way of packing them: shuffle with a fixed
// seed, concatenate, cut into sequences of T tokens (a document that crosses
// a cut continues in the next sequence).
#ifndef HSAP_COMMON_WORKLOAD_H_
#define HSAP_COMMON_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hsap {

// Reads one positive integer per line; blank lines and '#' comments skipped.
// INVALID_ARGUMENT names the file and line of a bad entry.
absl::StatusOr<std::vector<int64_t>> LoadDocumentLengths(const std::string& path);

// Packs `lengths` (shuffled with `seed`, repeated as often as needed) into
// `num_packs` sequences of `tokens_per_pack` tokens; returns each pack's
// cu_seqlens ([0, ..., tokens_per_pack]).
std::vector<std::vector<int64_t>> PackDocuments(const std::vector<int64_t>& lengths,
                                                int64_t tokens_per_pack, int num_packs,
                                                uint64_t seed);

// The path of workload `file_name`: $HSAP_WORKLOADS/<file>, else the runfiles
// of a Bazel target that depends on //workloads (TEST_SRCDIR, RUNFILES_DIR,
// or <binary>.runfiles), else workloads/<file> under $BUILD_WORKSPACE_DIRECTORY,
// the working directory or a folder above it. Returns "workloads/<file>"
// when none exists (the caller's read then names it).
std::string FindWorkload(const std::string& file_name = "python-stdlib.tokens");

}  // namespace hsap

#endif  // HSAP_COMMON_WORKLOAD_H_

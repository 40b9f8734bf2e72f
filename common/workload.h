// Real document-length workloads (../shared/workloads/*.tokens: one length
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

// The default workload path relative to the repository root, and a lookup
// that also tries the folders above the working directory and
// $HSAP_WORKLOADS (so tests under Bazel's runfiles find it).
std::string FindWorkload(const std::string& file_name = "python-stdlib.tokens");

}  // namespace hsap

#endif  // HSAP_COMMON_WORKLOAD_H_

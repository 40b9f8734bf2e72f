// The CUDA-free half of nccl_transport.h: option checks shared by the real
// transport and the build without CUDA.
#include "absl/strings/str_cat.h"
#include "server/transport/nccl_transport.h"

namespace hsap::transport {

// NCCL_UNIQUE_ID_BYTES, restated so this file needs no CUDA headers
// (nccl_transport.cc static_asserts that they agree).
constexpr size_t kNcclUniqueIdBytes = 128;

absl::Status ValidateNcclTransportOptions(const NcclTransportOptions& options) {
  if (options.unique_id.size() != kNcclUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("unique_id is ", options.unique_id.size(),
                                                   " bytes, expected ", kNcclUniqueIdBytes));
  }
  if (options.nranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nranks = ", options.nranks, " < 1"));
  }
  if (options.rank < 0 || options.rank >= options.nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside [0, nranks = ", options.nranks, ")"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device = ", options.device, " < 0"));
  }
  if (!options.node_of_rank.empty()) {
    if (static_cast<int64_t>(options.node_of_rank.size()) != options.nranks) {
      return absl::InvalidArgumentError(absl::StrCat("node_of_rank has ",
                                                     options.node_of_rank.size(),
                                                     " entries, nranks = ", options.nranks));
    }
    for (size_t r = 0; r < options.node_of_rank.size(); ++r) {
      if (options.node_of_rank[r] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("node_of_rank[", r, "] = ", options.node_of_rank[r], " < 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hsap::transport

// nccl_transport.h for builds without the CUDA toolkit: arguments are still
// checked (INVALID_ARGUMENT), then every factory is FAILED_PRECONDITION.
#include "server/transport/nccl_transport.h"

namespace hsap::transport {

namespace {
absl::Status BuiltWithoutCuda() {
  return absl::FailedPreconditionError(
      "the NCCL transport is unavailable: hsap was built without the CUDA toolkit");
}
}  // namespace

bool NcclTransportBuilt() { return false; }

absl::StatusOr<std::string> NewNcclUniqueId() { return BuiltWithoutCuda(); }

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(NcclTransportOptions options) {
  absl::Status valid = ValidateNcclTransportOptions(options);
  if (!valid.ok()) return valid;
  return BuiltWithoutCuda();
}

}  // namespace hsap::transport

#include "server/transport/ucx_status.h"

#include "absl/strings/str_cat.h"

namespace hsap::transport {

absl::Status UcxStatus(ucs_status_t status, absl::string_view what, const char* file, int line) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", ucs_status_string(status), " (UCS ",
                                           static_cast<int>(status), ") at ", file, ":", line);
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return absl::UnavailableError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_UNSUPPORTED:
      return absl::UnimplementedError(message);
    default:
      // Link and endpoint failures (a peer that died or became unreachable,
      // UCS_ERR_ENDPOINT_TIMEOUT among them) are the peer's unavailability.
      if (UCS_IS_LINK_ERROR(status) || UCS_IS_ENDPOINT_ERROR(status)) {
        return absl::UnavailableError(message);
      }
      return absl::InternalError(message);
  }
}

}  // namespace hsap::transport

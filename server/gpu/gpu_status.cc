#include "server/gpu/gpu_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hsap::gpu {

absl::Status CudaStatus(cudaError_t error, absl::string_view what, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error), " (", cudaGetErrorName(error), " ",
                   static_cast<int>(error), ") at ", file, ":", line);
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
      return absl::FailedPreconditionError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return absl::InvalidArgumentError(message);
    case cudaErrorNotReady:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what, const char* file, int line) {
  if (result == ncclSuccess) return absl::OkStatus();
  // NCCL keeps the last error's text per thread; the comm argument is unused.
  const char* last = ncclGetLastError(nullptr);
  const std::string detail =
      (last != nullptr && last[0] != '\0') ? absl::StrCat("; NCCL: ", last) : std::string();
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result), " (NCCL ",
                                           static_cast<int>(result), ")", detail, " at ", file,
                                           ":", line);
  switch (result) {
    case ncclInvalidArgument:
      return absl::InvalidArgumentError(message);
    case ncclInvalidUsage:
      return absl::FailedPreconditionError(message);
    case ncclSystemError:
    case ncclRemoteError:
    case ncclInProgress:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace hsap::gpu

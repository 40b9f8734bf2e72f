// The one place where absl::Status becomes grpc::Status (and back, for
// clients of the C++ library). Codes map one to one; messages pass through.
#ifndef HSAP_SERVER_GRPC_STATUS_UTIL_H_
#define HSAP_SERVER_GRPC_STATUS_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace hsap {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace hsap

#endif  // HSAP_SERVER_GRPC_STATUS_UTIL_H_

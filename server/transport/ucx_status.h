// UCX results as absl::Status (STYLE.md: one macro per foreign error space,
// recording file:line at the call site).
//
//   HSAP_UCX_RETURN_IF_ERROR(ucp_worker_create(context, &params, &worker),
//                            "ucp_worker_create");
//
// The message reads "ucp_worker_create: Invalid parameter (UCS -5) at
// server/transport/ucx_worker.cc:42".
#ifndef HSAP_SERVER_TRANSPORT_UCX_STATUS_H_
#define HSAP_SERVER_TRANSPORT_UCX_STATUS_H_

#include <ucs/type/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hsap::transport {

// Maps a UCS status to an absl::Status: UCS_OK -> OK; canceled -> CANCELLED;
// UCS_ERR_TIMED_OUT -> DEADLINE_EXCEEDED; unreachable, connection, link and
// endpoint failures -> UNAVAILABLE; no memory / no resource -> RESOURCE_EXHAUSTED; invalid
// parameter -> INVALID_ARGUMENT; truncation -> INTERNAL; the rest INTERNAL.
// `what` names the operation; `file`/`line` locate the call.
absl::Status UcxStatus(ucs_status_t status, absl::string_view what, const char* file, int line);

}  // namespace hsap::transport

// Evaluates `expr` (a ucs_status_t) and returns its absl::Status from the
// enclosing function when it is not UCS_OK.
#define HSAP_UCX_RETURN_IF_ERROR(expr, what)                                      \
  do {                                                                            \
    const ucs_status_t hsap_ucs_status_ = (expr);                                 \
    if (hsap_ucs_status_ != UCS_OK) {                                             \
      return ::hsap::transport::UcxStatus(hsap_ucs_status_, (what), __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

// The absl::Status of a ucs_status_t at this call site (for non-returning
// paths such as completed requests).
#define HSAP_UCX_STATUS(expr, what) \
  ::hsap::transport::UcxStatus((expr), (what), __FILE__, __LINE__)

#endif  // HSAP_SERVER_TRANSPORT_UCX_STATUS_H_

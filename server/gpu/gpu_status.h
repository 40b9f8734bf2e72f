// CUDA runtime and NCCL results as absl::Status (STYLE.md: one macro per
// foreign error space, recording file:line at the call site).
//
//   HSAP_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
//   HSAP_NCCL_RETURN_IF_ERROR(ncclCommCount(comm, &count));
//   // Calls on a non-blocking communicator may answer ncclInProgress:
//   HSAP_NCCL_RETURN_IF_FAILED(ncclGroupEnd());   // OK or in progress: poll
//
// A message reads "cudaSetDevice(device): invalid device ordinal
// (cudaErrorInvalidDevice 101) at server/gpu/cuda_stream.cc:31"; NCCL
// messages append NCCL's last error text ("Duplicate GPU detected ...") when
// it has one.
//
// Code mapping (the status the daemon reports, DESIGN.md §7):
//   CUDA: no device, no or too old a driver, stub library, device
//         unavailable -> FAILED_PRECONDITION; out of memory ->
//         RESOURCE_EXHAUSTED; invalid value / device / handle ->
//         INVALID_ARGUMENT; cudaErrorNotReady -> UNAVAILABLE (callers poll it
//         themselves); the rest (launch failures, illegal addresses: sticky
//         errors) -> INTERNAL.
//   NCCL: invalid argument -> INVALID_ARGUMENT; invalid usage (e.g. two ranks
//         on one GPU) -> FAILED_PRECONDITION; system and remote errors (a
//         peer or the network failed) -> UNAVAILABLE; in progress ->
//         UNAVAILABLE (only the strict macro sees it); unhandled CUDA and
//         internal errors -> INTERNAL.
#ifndef HSAP_SERVER_GPU_GPU_STATUS_H_
#define HSAP_SERVER_GPU_GPU_STATUS_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hsap::gpu {

// OK for cudaSuccess, otherwise the mapped status naming `what`, the CUDA
// error's name, text and number, and file:line.
absl::Status CudaStatus(cudaError_t error, absl::string_view what, const char* file, int line);

// OK for ncclSuccess, otherwise the mapped status naming `what`, NCCL's error
// string and number, NCCL's last error text (thread-local in NCCL, may be
// empty) and file:line.
absl::Status NcclStatus(ncclResult_t result, absl::string_view what, const char* file, int line);

}  // namespace hsap::gpu

// Evaluates `expr` (a cudaError_t) and returns its Status from the enclosing
// function unless it is cudaSuccess. The message names the expression.
#define HSAP_CUDA_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                     \
    const cudaError_t hsap_cuda_error_ = (expr);                                           \
    if (hsap_cuda_error_ != cudaSuccess) {                                                 \
      return ::hsap::gpu::CudaStatus(hsap_cuda_error_, #expr, __FILE__, __LINE__);         \
    }                                                                                      \
  } while (0)

// Evaluates `expr` (an ncclResult_t) and returns its Status from the
// enclosing function unless it is ncclSuccess.
#define HSAP_NCCL_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                     \
    const ncclResult_t hsap_nccl_result_ = (expr);                                         \
    if (hsap_nccl_result_ != ncclSuccess) {                                                \
      return ::hsap::gpu::NcclStatus(hsap_nccl_result_, #expr, __FILE__, __LINE__);        \
    }                                                                                      \
  } while (0)

// As HSAP_NCCL_RETURN_IF_ERROR, but ncclInProgress passes too: for calls on
// non-blocking communicators, whose caller then polls ncclCommGetAsyncError.
#define HSAP_NCCL_RETURN_IF_FAILED(expr)                                                   \
  do {                                                                                     \
    const ncclResult_t hsap_nccl_result_ = (expr);                                         \
    if (hsap_nccl_result_ != ncclSuccess && hsap_nccl_result_ != ncclInProgress) {         \
      return ::hsap::gpu::NcclStatus(hsap_nccl_result_, #expr, __FILE__, __LINE__);        \
    }                                                                                      \
  } while (0)

// The Status of a CUDA / NCCL result at this call site (non-returning paths).
#define HSAP_CUDA_STATUS(expr, what) ::hsap::gpu::CudaStatus((expr), (what), __FILE__, __LINE__)
#define HSAP_NCCL_STATUS(expr, what) ::hsap::gpu::NcclStatus((expr), (what), __FILE__, __LINE__)

#endif  // HSAP_SERVER_GPU_GPU_STATUS_H_

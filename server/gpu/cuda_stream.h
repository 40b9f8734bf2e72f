// CudaStream: a move-only owner of a CUDA stream on one device
// (cudaStreamCreateWithFlags / cudaStreamDestroy).
//
//   HSAP_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(device));
//   kernel<<<grid, block, 0, stream.get()>>>(...);
//   HSAP_RETURN_IF_ERROR(stream.Synchronize());
//
// Thread-safety: a stream may be used from any thread (CUDA's rule); the
// wrapper itself is not synchronized (move / destroy from one thread).
#ifndef HSAP_SERVER_GPU_CUDA_STREAM_H_
#define HSAP_SERVER_GPU_CUDA_STREAM_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsap::gpu {

class CudaStream {
 public:
  // A stream on `device`; by default non-blocking with respect to the legacy
  // default stream. FAILED_PRECONDITION / INVALID_ARGUMENT as CheckDevice.
  static absl::StatusOr<CudaStream> Create(int device,
                                           unsigned int flags = cudaStreamNonBlocking);

  CudaStream() = default;  // empty: get() == nullptr
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  // Destroys the stream (work already queued still completes: CUDA's rule).
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  bool valid() const { return stream_ != nullptr; }

  // Blocks until the stream's work completed; the first error it met.
  absl::Status Synchronize() const;

 private:
  CudaStream(cudaStream_t stream, int device) : stream_(stream), device_(device) {}
  void Reset();
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_CUDA_STREAM_H_

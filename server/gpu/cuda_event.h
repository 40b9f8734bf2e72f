// CudaEvent: a move-only owner of a CUDA event on one device
// (cudaEventCreateWithFlags / cudaEventDestroy), with the two operations a
// poller needs: Record on a stream, and a non-blocking Query.
//
//   HSAP_ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(device));
//   HSAP_RETURN_IF_ERROR(done.Record(stream.get()));
//   while (true) {
//     HSAP_ASSIGN_OR_RETURN(bool complete, done.Query());
//     if (complete) break;
//     ... check a deadline, sleep ...
//   }
#ifndef HSAP_SERVER_GPU_CUDA_EVENT_H_
#define HSAP_SERVER_GPU_CUDA_EVENT_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hsap::gpu {

class CudaEvent {
 public:
  // An event on `device`; by default without timing (the cheapest to record
  // and query). FAILED_PRECONDITION / INVALID_ARGUMENT as CheckDevice.
  static absl::StatusOr<CudaEvent> Create(int device,
                                          unsigned int flags = cudaEventDisableTiming);

  CudaEvent() = default;  // empty: get() == nullptr
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent();

  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }
  bool valid() const { return event_ != nullptr; }

  // Captures the work queued on `stream` so far. REQUIRES: valid(); `stream`
  // belongs to device().
  absl::Status Record(cudaStream_t stream);

  // true when the captured work completed, false while it runs (and for an
  // event never recorded: CUDA reports it complete, so true). An error is the
  // first error of that work (sticky CUDA errors are INTERNAL).
  absl::StatusOr<bool> Query() const;

 private:
  CudaEvent(cudaEvent_t event, int device) : event_(event), device_(device) {}
  void Reset();
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

}  // namespace hsap::gpu

#endif  // HSAP_SERVER_GPU_CUDA_EVENT_H_

// The compute backend: everything the executor (executor.h) asks of a
// device — memory, row copies, the attention work items and their
// companions — behind one small interface, so that one stage loop serves
// the CPU (cpu_backend.h) and CUDA GPUs (cuda_backend.h) alike (DESIGN.md §6).
//
// Memory. Allocate() returns zero-filled memory the backend's kernels can
// address (host memory for the CPU, device memory for CUDA). Whether the
// backend can also address ordinary host memory (clients' regions,
// transport staging) is addresses_host_memory(); when it cannot, the
// executor uploads the rank's inputs into backend memory first and
// downloads its outputs last, with kCopy row copies only.
//
// Ordering. Calls are queued in order on the backend's one stream of work
// (the CPU backend runs them at once); Synchronize() returns when all of it
// has completed. Results are deterministic: the same calls give the same
// bits (the CUDA backend's Backward is the exception documented there).
//
// Thread-safety: one rank's run uses a backend at a time; a backend may be
// shared by runs that take turns (the CPU backend serialises its pool).
#ifndef HSAP_SERVER_EXEC_COMPUTE_BACKEND_H_
#define HSAP_SERVER_EXEC_COMPUTE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "kernels/attention_params.h"
#include "server/exec/memory_budget.h"

namespace hsap::exec {

// Move-only owner of backend memory.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(void* data, int64_t bytes, std::function<void(void*)> release)
      : data_(static_cast<char*>(data)), bytes_(bytes), release_(std::move(release)) {}
  BackendBuffer(BackendBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)),
        release_(std::move(o.release_)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      release_ = std::move(o.release_);
    }
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  ~BackendBuffer() { Reset(); }

  char* data() const { return data_; }
  int64_t size() const { return bytes_; }
  float* floats() const { return reinterpret_cast<float*>(data_); }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  char* data_ = nullptr;
  int64_t bytes_ = 0;
  std::function<void(void*)> release_;
};

// When a call's kernels should give up: its deadline passed, or its caller
// went away (a cancelled gRPC call). Backends ask between blocks of work.
struct StopCheck {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // may be empty
  // Called between kernel waves on the calling thread, before Check (may be
  // empty): the executor advances the transfers a stage's compute overlaps.
  std::function<void()> between_waves;
  // DEADLINE_EXCEEDED or CANCELLED when the call should stop, else OK.
  absl::Status Check() const {
    if (cancelled && cancelled()) {
      return absl::CancelledError("the caller cancelled the call or went away");
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("the call's deadline passed during its kernels");
    }
    return absl::OkStatus();
  }
};

// Row copies (kernels/attention_params.h): pack, unpack, upload, download.
using ::hsap::kernels::CopyOp;
using ::hsap::kernels::RowCopy;

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu", "cuda", "cuda-emulated".
  virtual absl::string_view name() const = 0;
  // True when kernels and copies may address ordinary host memory.
  virtual bool addresses_host_memory() const = 0;
  // True when the host may read and write the backend's memory directly
  // (so a host-memory transport can move it).
  virtual bool memory_host_visible() const = 0;

  // `bytes` of zero-filled backend memory (an empty buffer for 0).
  // RESOURCE_EXHAUSTED when the memory is not there.
  virtual absl::StatusOr<BackendBuffer> Allocate(int64_t bytes) = 0;

  // The copies, in order. REQUIRES: no two copies of one call write the
  // same bytes (adds into one destination go in separate calls, in the
  // order they must be summed).
  virtual absl::Status Copy(absl::Span<const RowCopy> copies) = 0;
  // dst[i] = value for i < n (fp32, backend memory).
  virtual absl::Status Fill(float* dst, int64_t n, float value) = 0;

  // The work items (kernels/attention_params.h); accumulators merge.
  // `stop` (may be null) is checked between blocks of work: its status
  // (DEADLINE_EXCEEDED, CANCELLED) ends the call, accumulators partly merged.
  virtual absl::Status Forward(const kernels::AttentionShape& shape,
                               absl::Span<const kernels::FwdWorkItem> items,
                               const StopCheck* stop = nullptr) = 0;
  virtual absl::Status Backward(const kernels::AttentionShape& shape,
                                absl::Span<const kernels::BwdWorkItem> items,
                                const StopCheck* stop = nullptr) = 0;
  // delta[h * lse_stride + t] = sum_d dout[t, h, d] * o[t, h, d] (fp32) for
  // t < num_tokens; o, dout: [num_tokens, Hq, D] of shape.dtype.
  virtual absl::Status ComputeDelta(const kernels::AttentionShape& shape, const void* o,
                                    const void* dout, int64_t num_tokens, float* delta,
                                    int64_t lse_stride) = 0;
  // dst[i] = src[i] rounded to `dtype`, n elements.
  virtual absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst) = 0;

  // Returns once everything queued has completed; the first error it met.
  virtual absl::Status Synchronize() = 0;

  // The budget runs on this backend reserve their memory from before
  // allocating (memory_budget.h); null: unbounded.
  virtual MemoryBudget* memory_budget() const { return nullptr; }
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_COMPUTE_BACKEND_H_

// The CUDA compute backend: device memory, the kernels of kernels/cuda on
// one stream of its own. Storage bf16 or fp16, head dims 64, 128 or 256
// (kernels/cuda/attention.h); anything else is INVALID_ARGUMENT from the
// kernels, naming the field.
//
// The backend cannot address host memory, so the executor uploads a rank's
// inputs and downloads its outputs (rank_memory.h). Its memory is device
// memory, which only a device-memory transport (NCCL) can move — except
// under the CPU emulation of the kernels (//kernels/cuda:attention_emulated),
// where "device memory" is host memory: construct it with
// memory_host_visible = true there.
//
// Thread-safety: one run at a time (the executor's rule for a slot).
#ifndef HSAP_SERVER_EXEC_CUDA_BACKEND_H_
#define HSAP_SERVER_EXEC_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/attention.h"
#include "server/exec/compute_backend.h"

namespace hsap::exec {

struct CudaBackendOptions {
  // True only with the emulated kernels (see above).
  bool memory_host_visible = false;
};

class CudaBackend : public ComputeBackend {
 public:
  // A backend on the current CUDA device with a new stream;
  // FAILED_PRECONDITION without CUDA or a GPU.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(CudaBackendOptions options = {});
  ~CudaBackend() override;

  absl::string_view name() const override {
    return options_.memory_host_visible ? "cuda-emulated" : "cuda";
  }
  bool addresses_host_memory() const override { return false; }
  bool memory_host_visible() const override { return options_.memory_host_visible; }
  absl::StatusOr<BackendBuffer> Allocate(int64_t bytes) override;
  absl::Status Copy(absl::Span<const RowCopy> copies) override;
  absl::Status Fill(float* dst, int64_t n, float value) override;
  absl::Status Forward(const kernels::AttentionShape& shape,
                       absl::Span<const kernels::FwdWorkItem> items,
                       const StopCheck* stop = nullptr) override;
  absl::Status Backward(const kernels::AttentionShape& shape,
                        absl::Span<const kernels::BwdWorkItem> items,
                        const StopCheck* stop = nullptr) override;
  absl::Status ComputeDelta(const kernels::AttentionShape& shape, const void* o, const void* dout,
                            int64_t num_tokens, float* delta, int64_t lse_stride) override;
  absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst) override;
  absl::Status Synchronize() override;

  kernels::cuda::CudaStream stream() const { return stream_; }

 private:
  CudaBackend(CudaBackendOptions options, kernels::cuda::CudaStream stream)
      : options_(options), stream_(stream) {}
  const CudaBackendOptions options_;
  const kernels::cuda::CudaStream stream_;
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_CUDA_BACKEND_H_

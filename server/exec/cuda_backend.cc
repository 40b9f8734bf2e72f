#include "server/exec/cuda_backend.h"

#include "common/status_macros.h"

namespace hsap::exec {

namespace kcu = kernels::cuda;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(CudaBackendOptions options) {
  kcu::CudaStream stream = nullptr;
  HSAP_RETURN_IF_ERROR(kcu::StreamCreate(&stream));
  return std::unique_ptr<CudaBackend>(new CudaBackend(options, stream));
}

CudaBackend::~CudaBackend() {
  (void)kcu::StreamSynchronize(stream_);
  kcu::StreamDestroy(stream_);
}

absl::StatusOr<BackendBuffer> CudaBackend::Allocate(int64_t bytes) {
  void* data = nullptr;
  HSAP_RETURN_IF_ERROR(kcu::DeviceAllocate(bytes, &data));
  if (data == nullptr) return BackendBuffer();
  // cudaFree waits for the work using the memory (CUDA's rule).
  return BackendBuffer(data, bytes, [](void* p) { kcu::DeviceFree(p); });
}

absl::Status CudaBackend::Copy(absl::Span<const RowCopy> copies) {
  return kcu::CopyRows(copies, stream_);
}

absl::Status CudaBackend::Fill(float* dst, int64_t n, float value) {
  return kcu::Fill(dst, n, value, stream_);
}

// The launches are asynchronous: the stop check runs before each is queued.
absl::Status CudaBackend::Forward(const kernels::AttentionShape& shape,
                                  absl::Span<const kernels::FwdWorkItem> items,
                                  const StopCheck* stop) {
  if (stop != nullptr) HSAP_RETURN_IF_ERROR(stop->Check());
  return kcu::Forward(shape, items, stream_);
}

absl::Status CudaBackend::Backward(const kernels::AttentionShape& shape,
                                   absl::Span<const kernels::BwdWorkItem> items,
                                   const StopCheck* stop) {
  if (stop != nullptr) HSAP_RETURN_IF_ERROR(stop->Check());
  return kcu::Backward(shape, items, stream_);
}

absl::Status CudaBackend::ComputeDelta(const kernels::AttentionShape& shape, const void* o,
                                       const void* dout, int64_t num_tokens, float* delta,
                                       int64_t lse_stride) {
  return kcu::ComputeDelta(shape, o, dout, num_tokens, delta, lse_stride, stream_);
}

absl::Status CudaBackend::CastFromFloat(const float* src, int64_t n, DType dtype, void* dst) {
  return kcu::CastFromFloat(src, n, dtype, dst, stream_);
}

absl::Status CudaBackend::Synchronize() { return kcu::StreamSynchronize(stream_); }

}  // namespace hsap::exec

// kernels/cuda/attention.h for builds without the CUDA toolkit
// (tools/cuda_rules.bzl fallback_srcs): every call reports FAILED_PRECONDITION
// "built without CUDA", so dependents build and choose the CPU backend.
#include "kernels/cuda/attention.h"

namespace hsap::kernels::cuda {
namespace {

absl::Status NoCuda(const char* what) {
  return absl::FailedPreconditionError(
      std::string(what) + ": built without CUDA (no /usr/local/cuda at build time)");
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::Status Forward(const AttentionShape&, absl::Span<const FwdWorkItem>, CudaStream) {
  return NoCuda("Forward");
}
absl::Status Backward(const AttentionShape&, absl::Span<const BwdWorkItem>, CudaStream) {
  return NoCuda("Backward");
}
absl::Status ComputeDelta(const AttentionShape&, const void*, const void*, int64_t, float*,
                          int64_t, CudaStream) {
  return NoCuda("ComputeDelta");
}
absl::Status MergePartial(int, int, int64_t, float*, float*, const float*, const float*, int64_t,
                          CudaStream) {
  return NoCuda("MergePartial");
}
absl::Status CastFromFloat(const float*, int64_t, DType, void*, CudaStream) {
  return NoCuda("CastFromFloat");
}
absl::Status Pack(const void*, int64_t, absl::Span<const TokenRange>, void*, CudaStream) {
  return NoCuda("Pack");
}
absl::Status Unpack(const void*, int64_t, absl::Span<const TokenRange>, void*, CudaStream) {
  return NoCuda("Unpack");
}
absl::Status UnpackAdd(const float*, int64_t, absl::Span<const TokenRange>, float*, CudaStream) {
  return NoCuda("UnpackAdd");
}
absl::Status DeviceAllocate(int64_t, void** out) {
  *out = nullptr;
  return NoCuda("DeviceAllocate");
}
void DeviceFree(void*) {}
absl::Status StreamCreate(CudaStream* out) {
  *out = nullptr;
  return NoCuda("StreamCreate");
}
void StreamDestroy(CudaStream) {}
absl::Status StreamSynchronize(CudaStream) { return NoCuda("StreamSynchronize"); }
absl::Status Fill(float*, int64_t, float, CudaStream) { return NoCuda("Fill"); }
absl::Status CopyRows(absl::Span<const RowCopy>, CudaStream) { return NoCuda("CopyRows"); }

}  // namespace hsap::kernels::cuda

#include "server/exec/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"

namespace hsap::exec {

CpuBackend::CpuBackend(int num_threads, MemoryBudget* budget)
    : own_pool_(std::make_unique<ThreadPool>(std::max(1, num_threads))),
      pool_(own_pool_.get()),
      budget_(budget) {}

CpuBackend::CpuBackend(ThreadPool* pool) : pool_(pool) {}

absl::StatusOr<BackendBuffer> CpuBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes is ", bytes));
  if (bytes == 0) return BackendBuffer();
  void* data = std::calloc(1, static_cast<size_t>(bytes));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory for the CPU kernels"));
  }
  return BackendBuffer(data, bytes, [](void* p) { std::free(p); });
}

void RunRowCopies(absl::Span<const RowCopy> copies) {
  for (const RowCopy& c : copies) {
    const char* src = static_cast<const char*>(c.src);
    char* dst = static_cast<char*>(c.dst);
    for (int64_t r = 0; r < c.rows; ++r, src += c.src_stride, dst += c.dst_stride) {
      switch (c.op) {
        case CopyOp::kCopy:
          std::memcpy(dst, src, c.elems);
          break;
        case CopyOp::kStoreFloat:
          if (c.dtype == DType::kFloat32) {
            std::memcpy(dst, src, c.elems * sizeof(float));
          } else {
            const float* f = reinterpret_cast<const float*>(src);
            for (int64_t i = 0; i < c.elems; ++i) StoreFromFloat(dst, c.dtype, i, f[i]);
          }
          break;
        case CopyOp::kAddLoaded: {
          float* f = reinterpret_cast<float*>(dst);
          for (int64_t i = 0; i < c.elems; ++i) f[i] += LoadAsFloat(src, c.dtype, i);
          break;
        }
      }
    }
  }
}

absl::Status CpuBackend::Copy(absl::Span<const RowCopy> copies) {
  RunRowCopies(copies);
  return absl::OkStatus();
}

absl::Status CpuBackend::Fill(float* dst, int64_t n, float value) {
  std::fill_n(dst, n, value);
  return absl::OkStatus();
}

namespace {

// The kernels' stop callback for `stop` (null: never), remembering why.
kernels::cpu::StopFn StopFnFor(const StopCheck* stop, absl::Status* why) {
  if (stop == nullptr) return nullptr;
  return [stop, why] {
    if (stop->between_waves) stop->between_waves();
    *why = stop->Check();
    return !why->ok();
  };
}

}  // namespace

absl::Status CpuBackend::Forward(const kernels::AttentionShape& shape,
                                 absl::Span<const kernels::FwdWorkItem> items,
                                 const StopCheck* stop) {
  absl::Status why;
  const kernels::cpu::StopFn fn = StopFnFor(stop, &why);
  if (!kernels::cpu::Forward(shape, items, pool_, &fn)) return why;
  return absl::OkStatus();
}

absl::Status CpuBackend::Backward(const kernels::AttentionShape& shape,
                                  absl::Span<const kernels::BwdWorkItem> items,
                                  const StopCheck* stop) {
  absl::Status why;
  const kernels::cpu::StopFn fn = StopFnFor(stop, &why);
  if (!kernels::cpu::Backward(shape, items, pool_, &fn)) return why;
  return absl::OkStatus();
}

absl::Status CpuBackend::ComputeDelta(const kernels::AttentionShape& shape, const void* o,
                                      const void* dout, int64_t num_tokens, float* delta,
                                      int64_t lse_stride) {
  kernels::cpu::ComputeDelta(shape, o, dout, num_tokens, delta, lse_stride, pool_);
  return absl::OkStatus();
}

absl::Status CpuBackend::CastFromFloat(const float* src, int64_t n, DType dtype, void* dst) {
  kernels::cpu::CastFromFloat(src, n, dtype, dst, pool_);
  return absl::OkStatus();
}

}  // namespace hsap::exec

// kernels/cuda/attention.h implemented on the CPU through the emulation of
// the CUDA features the kernels use (emulation.h): the kernels' own source
// (forward_kernel.cuh, backward_kernel.cuh, exact_kernels.cuh,
// util_kernels.cuh) on the launch
// plans the real entry points build (launch_plan.h). Test-only: it lets the
// executor's CUDA backend run whole plans in CI, without a GPU
// (tests/gpu:executor_emulation_test).
//
// Model: "device memory" is host memory (DeviceAllocate is calloc), a
// stream is a synchronous queue (every call has completed when it
// returns; StreamSynchronize only reports), kCopy row copies are memcpy (as
// cudaMemcpy2DAsync). Launches run one at a time: the emulator's scheduler
// and shared memory are process-wide, so a mutex serialises callers.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/backward_kernel.cuh"
#include "kernels/cuda/emulation.h"
#include "kernels/cuda/exact_kernels.cuh"
#include "kernels/cuda/forward_kernel.cuh"
#include "kernels/cuda/launch_plan.h"
#include "kernels/cuda/util_kernels.cuh"

namespace hsap::kernels::cuda {
namespace {

namespace kern = kernel;

// The element-wise kernels are grid-stride loops: a few CTAs cover any size,
// and each emulated CTA costs its 256 fibers.
int SmallGrid(int64_t n) { return std::min(kern::GridFor(n), 4); }

// The scan and exact kernels are block-stride / grid-stride loops: any
// block size computes the same; one warp per CTA keeps the emulation's
// per-fiber cost (a context switch each) small next to the tile kernels.
constexpr int kEmulatedSmallThreads = 32;

std::mutex& LaunchMutex() {
  static std::mutex mu;
  return mu;
}

// One exact launch per item in item order, as attention_fwd.cu /
// attention_bwd.cu; each returns at once unless its item is flagged.
template <typename Kernel>
void EmulateExact(const AttentionShape& s, const void* items, const int64_t* num_q,
                  const int64_t* num_k, size_t num_items, const uint8_t* exact, Kernel kernel) {
  for (size_t i = 0; i < num_items; ++i) {
    if (num_q[i] <= 0 || num_k[i] <= 0) continue;
    const kern::ExactParams p{items,         exact,           static_cast<int>(i),
                              s.num_heads_q, s.num_heads_kv, s.head_dim,
                              static_cast<double>(s.softmax_scale)};
    // The kernels are grid-stride loops: one CTA is the same computation.
    emu::Launch(1, 1, kEmulatedSmallThreads, [&] { kernel(p); });
  }
}

template <typename T, int D>
void EmulateForward(const AttentionShape& s, const internal::ForwardPlan& plan) {
  // The scan's flags (device scratch on a GPU), zeroed.
  std::vector<uint8_t> exact(plan.items.size(), 0);
  const int num_items = static_cast<int>(plan.items.size());
  emu::Launch(num_items, kern::kScanForwardTensors, kEmulatedSmallThreads, [&] {
    kern::ScanForwardKernel<T>(plan.items.data(), s.num_heads_q, s.num_heads_kv, s.head_dim,
                               exact.data());
  });
  for (size_t w = 0; w + 1 < plan.wave_begin.size(); ++w) {
    kern::FwdParams p;
    p.items = plan.items.data();
    p.tiles = plan.tiles.data() + plan.wave_begin[w];
    p.num_heads_q = s.num_heads_q;
    p.group = s.num_heads_q / s.num_heads_kv;
    p.scale_log2 = s.softmax_scale * 1.4426950408889634f;
    p.exact = exact.data();
    const int tiles = static_cast<int>(plan.wave_begin[w + 1] - plan.wave_begin[w]);
    if (tiles == 0) continue;
    emu::Launch(tiles, s.num_heads_q, kern::kFwdThreads, [&] { kern::ForwardKernel<T, D>(p); });
  }
  std::vector<int64_t> num_q, num_k;
  for (const FwdWorkItem& it : plan.items) {
    num_q.push_back(it.num_q);
    num_k.push_back(it.num_k);
  }
  EmulateExact(s, plan.items.data(), num_q.data(), num_k.data(), plan.items.size(), exact.data(),
               [](const kern::ExactParams& p) { kern::ExactForwardKernel<T>(p); });
}

template <typename T, int D>
void EmulateBackward(const AttentionShape& s, const internal::BackwardPlan& plan) {
  std::vector<uint8_t> exact(plan.items.size(), 0);
  const int num_items = static_cast<int>(plan.items.size());
  emu::Launch(num_items, kern::kScanBackwardTensors, kEmulatedSmallThreads, [&] {
    kern::ScanBackwardKernel<T>(plan.items.data(), s.num_heads_q, s.num_heads_kv, s.head_dim,
                                exact.data());
  });
  kern::BwdParams p;
  p.items = plan.items.data();
  p.tiles = plan.tiles.data();
  p.num_heads_q = s.num_heads_q;
  p.num_heads_kv = s.num_heads_kv;
  p.group = s.num_heads_q / s.num_heads_kv;
  p.scale = s.softmax_scale;
  p.scale_log2 = s.softmax_scale * 1.4426950408889634f;
  p.exact = exact.data();
  emu::Launch(static_cast<int>(plan.tiles.size()), s.num_heads_q, kern::BwdTraits<D>::kThreads,
              [&] { kern::BackwardKernel<T, D>(p); });
  std::vector<int64_t> num_q, num_k;
  for (const BwdWorkItem& it : plan.items) {
    num_q.push_back(it.num_q);
    num_k.push_back(it.num_k);
  }
  EmulateExact(s, plan.items.data(), num_q.data(), num_k.data(), plan.items.size(), exact.data(),
               [](const kern::ExactParams& p) { kern::ExactBackwardKernel<T>(p); });
}

template <typename T>
void ForwardD(const AttentionShape& s, const internal::ForwardPlan& plan) {
  switch (s.head_dim) {
    case 64: return EmulateForward<T, 64>(s, plan);
    case 128: return EmulateForward<T, 128>(s, plan);
    default: return EmulateForward<T, 256>(s, plan);
  }
}

template <typename T>
void BackwardD(const AttentionShape& s, const internal::BackwardPlan& plan) {
  switch (s.head_dim) {
    case 64: return EmulateBackward<T, 64>(s, plan);
    case 128: return EmulateBackward<T, 128>(s, plan);
    default: return EmulateBackward<T, 256>(s, plan);
  }
}

template <bool kToPacked>
absl::Status PackOrUnpack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                          void* dst) {
  if (row_bytes <= 0) return absl::InvalidArgumentError(absl::StrCat("row_bytes: ", row_bytes));
  std::vector<kern::PackedRange> packed;
  int64_t rows = 0;
  HSAP_RETURN_IF_ERROR(kern::BuildPackedRanges(ranges, &packed, &rows));
  if (rows == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(rows * row_bytes), 1, kern::kThreads, [&] {
    kern::PackKernel<uint8_t, kToPacked>(packed.data(), static_cast<int>(packed.size()), rows,
                                         row_bytes, static_cast<const uint8_t*>(src),
                                         static_cast<uint8_t*>(dst));
  });
  return absl::OkStatus();
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::Status Forward(const AttentionShape& shape, absl::Span<const FwdWorkItem> items,
                     CudaStream) {
  internal::ForwardPlan plan;
  HSAP_RETURN_IF_ERROR(
      internal::PlanForward(shape, items, kern::ForwardBlockQ(shape.head_dim), &plan));
  if (plan.tiles.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  if (shape.dtype == DType::kBFloat16) {
    ForwardD<__nv_bfloat16>(shape, plan);
  } else {
    ForwardD<__half>(shape, plan);
  }
  return absl::OkStatus();
}

absl::Status Backward(const AttentionShape& shape, absl::Span<const BwdWorkItem> items,
                      CudaStream) {
  internal::BackwardPlan plan;
  HSAP_RETURN_IF_ERROR(internal::PlanBackward(shape, items, kern::kBwdBlockK, &plan));
  if (plan.tiles.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  if (shape.dtype == DType::kBFloat16) {
    BackwardD<__nv_bfloat16>(shape, plan);
  } else {
    BackwardD<__half>(shape, plan);
  }
  return absl::OkStatus();
}

absl::Status ComputeDelta(const AttentionShape& shape, const void* o, const void* dout,
                          int64_t num_tokens, float* delta, int64_t lse_stride, CudaStream) {
  if (shape.num_heads_q <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads_q/head_dim: ", shape.num_heads_q,
                                                   "/", shape.head_dim));
  }
  if (num_tokens <= 0) return absl::OkStatus();
  const int64_t warps = num_tokens * shape.num_heads_q;
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(warps * 32), 1, kern::kThreads, [&] {
    kern::DeltaKernel(o, dout, shape.dtype, num_tokens, shape.num_heads_q, shape.head_dim, delta,
                      lse_stride);
  });
  return absl::OkStatus();
}

absl::Status MergePartial(int num_heads, int head_dim, int64_t num_rows, float* o_a,
                          float* lse_a, const float* o_b, const float* lse_b, int64_t lse_stride,
                          CudaStream) {
  if (num_rows <= 0 || num_heads <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(num_rows * num_heads), 1, kern::kThreads, [&] {
    kern::MergeKernel(num_heads, head_dim, num_rows, o_a, lse_a, o_b, lse_b, lse_stride);
  });
  return absl::OkStatus();
}

absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst, CudaStream) {
  if (n <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(n), 1, kern::kThreads, [&] { kern::CastKernel(src, n, dtype, dst); });
  return absl::OkStatus();
}

absl::Status Pack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                  void* dst, CudaStream) {
  return PackOrUnpack<true>(src, row_bytes, ranges, dst);
}

absl::Status Unpack(const void* src, int64_t row_bytes, absl::Span<const TokenRange> ranges,
                    void* dst, CudaStream) {
  return PackOrUnpack<false>(src, row_bytes, ranges, dst);
}

absl::Status UnpackAdd(const float* src, int64_t row_elems, absl::Span<const TokenRange> ranges,
                       float* dst, CudaStream) {
  if (row_elems <= 0) return absl::InvalidArgumentError(absl::StrCat("row_elems: ", row_elems));
  std::vector<kern::PackedRange> packed;
  int64_t rows = 0;
  HSAP_RETURN_IF_ERROR(kern::BuildPackedRanges(ranges, &packed, &rows));
  if (rows == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(rows * row_elems), 1, kern::kThreads, [&] {
    kern::UnpackAddKernel(packed.data(), static_cast<int>(packed.size()), rows, row_elems, src,
                          dst);
  });
  return absl::OkStatus();
}

absl::Status DeviceAllocate(int64_t bytes, void** out) {
  *out = nullptr;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("bytes: ", bytes));
  if (bytes == 0) return absl::OkStatus();
  *out = std::calloc(1, static_cast<size_t>(bytes));
  if (*out == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

void DeviceFree(void* p) { std::free(p); }

absl::Status StreamCreate(CudaStream* out) {
  *out = nullptr;  // the emulated stream: everything runs at once
  return absl::OkStatus();
}

void StreamDestroy(CudaStream) {}

absl::Status StreamSynchronize(CudaStream) { return absl::OkStatus(); }

absl::Status Fill(float* dst, int64_t n, float value, CudaStream) {
  if (n <= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(n), 1, kern::kThreads, [&] { kern::FillKernel(dst, n, value); });
  return absl::OkStatus();
}

absl::Status CopyRows(absl::Span<const RowCopy> copies, CudaStream) {
  std::vector<kern::ConvertOp> ops;
  int64_t total = 0;
  HSAP_RETURN_IF_ERROR(kern::BuildConvertOps(copies, &ops, &total));
  for (const RowCopy& c : copies) {
    if (c.op != CopyOp::kCopy) continue;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::memcpy(static_cast<char*>(c.dst) + r * c.dst_stride,
                  static_cast<const char*>(c.src) + r * c.src_stride, c.elems);
    }
  }
  if (total == 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(LaunchMutex());
  emu::Launch(SmallGrid(total), 1, kern::kThreads, [&] {
    kern::ConvertRowsKernel(ops.data(), static_cast<int>(ops.size()), total);
  });
  return absl::OkStatus();
}

}  // namespace hsap::kernels::cuda

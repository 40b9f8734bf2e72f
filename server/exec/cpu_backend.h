// The CPU compute backend: host memory, the kernels of kernels/cpu on one
// thread pool. The daemon makes one per device slot (`--devices=cpu:N`),
// each with its own pool, so slots compute in parallel.
//
//   CpuBackend backend(/*num_threads=*/2);
//   HSAP_RETURN_IF_ERROR(exec::RunForward(plan, rank, shape, buffers, transport, &backend, ...));
#ifndef HSAP_SERVER_EXEC_CPU_BACKEND_H_
#define HSAP_SERVER_EXEC_CPU_BACKEND_H_

#include <memory>

#include "common/thread_pool.h"
#include "server/exec/compute_backend.h"

namespace hsap::exec {

class CpuBackend : public ComputeBackend {
 public:
  // A backend with a pool of its own of `num_threads` (>= 1) threads; runs
  // on it reserve their memory from `budget` when given (it must outlive
  // the backend).
  explicit CpuBackend(int num_threads, MemoryBudget* budget = nullptr);
  // A backend on `pool`, which must outlive it (shared with others: their
  // parallel loops take turns).
  explicit CpuBackend(ThreadPool* pool);

  absl::string_view name() const override { return "cpu"; }
  bool addresses_host_memory() const override { return true; }
  bool memory_host_visible() const override { return true; }
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
  absl::Status Synchronize() override { return absl::OkStatus(); }
  MemoryBudget* memory_budget() const override { return budget_; }

  ThreadPool* pool() const { return pool_; }

 private:
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_;
  MemoryBudget* budget_ = nullptr;
};

// Runs `copies` on the calling thread (the CPU backend's Copy; also the
// reference the other backends' copies are tested against).
void RunRowCopies(absl::Span<const RowCopy> copies);

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_CPU_BACKEND_H_

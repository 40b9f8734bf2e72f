// A compute backend that holds each slot to a fixed attention rate: the
// emulated cluster's per-rank compute cap (bench/emulated_cluster/README.md).
//
// On one machine, the emulation's ranks are threads sharing its cores:
// while some ranks of an imbalanced plan wait on others, the busy ones run
// faster than the rate calibrated with every rank busy, so imbalance costs
// less than on a cluster, where each GPU is its own. PacedBackend restores
// that: Forward and Backward return no sooner than the cost model's FLOPs
// of their items (plan/cost_model.cc: 4 * area * Hq * D, times
// kPacedBackwardFactor for backward) over `flops_per_s`, driving the stage's
// transfers (StopCheck::between_waves) and honouring its deadline and
// cancellation while they wait. Set below the fair share of the machine,
// every rank computes at exactly that rate however the others are loaded.
// Everything else forwards to the wrapped backend.
//
//   auto slot = std::make_unique<PacedBackend>(std::make_unique<CpuBackend>(1), 5e9);
//
// hsapd --emulate_flops_per_s turns it on; it is not for production.
#ifndef HSAP_SERVER_EXEC_PACED_BACKEND_H_
#define HSAP_SERVER_EXEC_PACED_BACKEND_H_

#include <memory>

#include "server/exec/compute_backend.h"

namespace hsap::exec {

// The backward FLOPs PacedBackend charges per forward FLOP of the same
// items: the parametric profiles' default backward_factor.
inline constexpr double kPacedBackwardFactor = 2.5;

class PacedBackend : public ComputeBackend {
 public:
  // REQUIRES: inner != null, flops_per_s > 0.
  PacedBackend(std::unique_ptr<ComputeBackend> inner, double flops_per_s)
      : inner_(std::move(inner)), flops_per_s_(flops_per_s) {}

  absl::string_view name() const override { return inner_->name(); }
  bool addresses_host_memory() const override { return inner_->addresses_host_memory(); }
  bool memory_host_visible() const override { return inner_->memory_host_visible(); }
  absl::StatusOr<BackendBuffer> Allocate(int64_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::Status Copy(absl::Span<const RowCopy> copies) override { return inner_->Copy(copies); }
  absl::Status Fill(float* dst, int64_t n, float value) override {
    return inner_->Fill(dst, n, value);
  }
  absl::Status Forward(const kernels::AttentionShape& shape,
                       absl::Span<const kernels::FwdWorkItem> items,
                       const StopCheck* stop = nullptr) override;
  absl::Status Backward(const kernels::AttentionShape& shape,
                        absl::Span<const kernels::BwdWorkItem> items,
                        const StopCheck* stop = nullptr) override;
  absl::Status ComputeDelta(const kernels::AttentionShape& shape, const void* o, const void* dout,
                            int64_t num_tokens, float* delta, int64_t lse_stride) override {
    return inner_->ComputeDelta(shape, o, dout, num_tokens, delta, lse_stride);
  }
  absl::Status CastFromFloat(const float* src, int64_t n, DType dtype, void* dst) override {
    return inner_->CastFromFloat(src, n, dtype, dst);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  MemoryBudget* memory_budget() const override { return inner_->memory_budget(); }

 private:
  // Waits until `start` + flops / flops_per_s_, advancing transfers; the
  // stop's status if it fires first.
  absl::Status WaitUntilPaced(absl::Time start, double flops, const StopCheck* stop) const;

  std::unique_ptr<ComputeBackend> inner_;
  double flops_per_s_;
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_PACED_BACKEND_H_

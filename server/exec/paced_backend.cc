#include "server/exec/paced_backend.h"

#include <algorithm>

#include "common/mask.h"

namespace hsap::exec {
namespace {

// The cost model's forward FLOPs of `items` (plan/cost_model.cc).
template <typename Item>
double ForwardFlops(const kernels::AttentionShape& shape, absl::Span<const Item> items) {
  double area = 0;
  for (const Item& w : items) {
    MaskSlice s;
    s.q_end = w.num_q;
    s.k_end = w.num_k;
    s.type = w.type;
    s.offset = w.offset;
    s.window = w.window;
    area += static_cast<double>(SliceArea(s));
  }
  return 4.0 * area * shape.num_heads_q * shape.head_dim;
}

// How long one wait lasts before the transfers are driven again.
constexpr absl::Duration kPaceTick = absl::Microseconds(500);

}  // namespace

absl::Status PacedBackend::WaitUntilPaced(absl::Time start, double flops,
                                          const StopCheck* stop) const {
  const absl::Time until = start + absl::Seconds(flops / flops_per_s_);
  for (absl::Time now = absl::Now(); now < until; now = absl::Now()) {
    if (stop != nullptr) {
      if (stop->between_waves) stop->between_waves();
      if (absl::Status s = stop->Check(); !s.ok()) return s;
    }
    absl::SleepFor(std::min(kPaceTick, until - now));
  }
  return absl::OkStatus();
}

absl::Status PacedBackend::Forward(const kernels::AttentionShape& shape,
                                   absl::Span<const kernels::FwdWorkItem> items,
                                   const StopCheck* stop) {
  const absl::Time start = absl::Now();
  if (absl::Status s = inner_->Forward(shape, items, stop); !s.ok()) return s;
  return WaitUntilPaced(start, ForwardFlops(shape, items), stop);
}

absl::Status PacedBackend::Backward(const kernels::AttentionShape& shape,
                                    absl::Span<const kernels::BwdWorkItem> items,
                                    const StopCheck* stop) {
  const absl::Time start = absl::Now();
  if (absl::Status s = inner_->Backward(shape, items, stop); !s.ok()) return s;
  return WaitUntilPaced(start, kPacedBackwardFactor * ForwardFlops(shape, items), stop);
}

}  // namespace hsap::exec

// MeasuredProfiles: what this daemon measured of itself, for the cost
// model's `measured` profile (hsapd --profile=measured, the default;
// docs/cost_model.md, "Measured profiles").
//
// Compute: the first time a plan needs a (dtype, head dim), a short causal
// attention run — one head of N tokens with N chosen so that a forward is
// about 32 MFLOP; forward, then backward, each one warm-up and then runs
// over a 20 ms window (2 to 64 runs, their mean) — on every device slot at
// the same time, so that slots that share cores are measured sharing them.
// The forward rate is the mean over slots of 4 * D * area / (mean
// forward); backward_factor is the mean backward's time over the mean
// forward's. Both are rounded to three significant digits and cached for
// the daemon's life (at most kMaxEntries head dims per dtype; beyond them
// the nearest one measured serves).
//
// Interleaved heads: a rank's buffers hold its heads interleaved in each
// row ([rows, H, D]), and the CPU kernels' per-head rate falls with H (on
// this project's machine, D 64: 8 heads ran at 0.78-0.88 of one head's
// per-head rate; the cause, cache or TLB, is not established). Eight heads
// (the last N/8 rows against all N keys) run as eight one-head items in
// buffers of their own and as one item of eight interleaved heads (the
// same work and memory; two rounds of one forward each, alternating):
// kv_interleave_factor = cbrt(mean over rounds of rate interleaved /
// rate separate), in [0.5, 1]; the cost model applies it per doubling of a
// rank's KV heads. A slot whose memory budget has no room for the pair
// leaves it out (factor 1 when none could).
//
// Intra-node tier, measured once: a memory copy's bandwidth (8 MiB, best
// of five) and the latency of handing a message to another thread (median
// of 200 round trips, halved).
//
// Thread-safe. One measurement runs at a time; callers of the same key
// wait for it. A caller's StopCheck (its call's deadline and cancellation)
// reaches the measurement's kernels and the wait for another caller's
// measurement: a measurement it ends is not kept (the next caller measures
// again).
#ifndef HSAP_SERVER_EXEC_MEASURED_PROFILE_H_
#define HSAP_SERVER_EXEC_MEASURED_PROFILE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "server/exec/device_slots.h"
#include "server/plan/cost_model.h"

namespace hsap::exec {

struct ComputeRate {
  DType dtype = DType::kFloat32;
  int32_t head_dim = 0;
  double forward_flops = 0;    // forward attention FLOP/s of one slot
  double backward_factor = 0;  // backward time / forward time, same work
  // The per-head rate's factor per doubling of the KV heads interleaved in a
  // row (plan::HardwareProfile::kv_interleave_factor).
  double kv_interleave_factor = 1;
};

struct IntraTier {
  double bytes_per_s = 0;
  double latency_s = 0;
};

// The profile of a plan on one node: `rate`'s compute, the intra tier, and
// the inter tier given (a group's measured links; for a one-node group,
// which moves nothing between nodes, the intra tier's figures).
plan::HardwareProfile MeasuredHardwareProfile(const ComputeRate& rate, const IntraTier& intra,
                                              double inter_bytes_per_s, double inter_latency_s);

class MeasuredProfiles {
 public:
  static constexpr int kMaxEntries = 16;  // head dims measured per dtype

  // `slots` must outlive this.
  explicit MeasuredProfiles(DeviceSlots* slots) : slots_(slots) {}

  // The compute rate for plans of `dtype` and `head_dim` (measured now if
  // it has not been; REQUIRES 1 <= head_dim <= 4096). Errors of the
  // backends (RESOURCE_EXHAUSTED when the memory budget has no room);
  // `stop`'s (DEADLINE_EXCEEDED, CANCELLED) when it fires first (may be
  // null: no bound).
  absl::StatusOr<ComputeRate> Compute(DType dtype, int32_t head_dim,
                                      const StopCheck* stop = nullptr);
  // The intra-node tier (measured now if it has not been).
  IntraTier Intra();
  // The parametric profile ("custom:...") of a plan that lives on this
  // node only.
  absl::StatusOr<std::string> LocalProfile(DType dtype, int32_t head_dim,
                                           const StopCheck* stop = nullptr);

  // What was measured so far (dtype, then head dim order).
  std::vector<ComputeRate> Measured() const;
  bool intra_measured() const;
  IntraTier intra_if_measured() const;

 private:
  absl::StatusOr<ComputeRate> Measure(DType dtype, int32_t head_dim, const StopCheck* stop);

  DeviceSlots* const slots_;
  absl::Mutex measure_mu_;  // one measurement at a time (held briefly: see computing_)
  mutable absl::Mutex mu_;
  // A compute measurement is running; others wait on mu_ for it to end, so
  // that their StopCheck can end the wait.
  bool computing_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<int, int32_t>, ComputeRate> rates_ ABSL_GUARDED_BY(mu_);
  bool intra_done_ ABSL_GUARDED_BY(mu_) = false;
  IntraTier intra_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsap::exec

#endif  // HSAP_SERVER_EXEC_MEASURED_PROFILE_H_

// The daemon's metric set: every hsap_* family hsapd exports, registered on
// a Registry the daemon owns, with plain methods for the places that record.
//
// Labels are bounded by construction: op, strategy, status, direction and
// tier come from fixed sets (anything unknown is recorded as "other"), and
// devices are the daemon's slots, fixed at construction. Group names,
// session ids and other run-time values never become labels.
//
//   hsap_calls_total{op,strategy,status}            counter
//   hsap_call_duration_seconds{op}                  histogram
//   hsap_transfer_bytes_total{direction,tier}       counter
//   hsap_plan_cache_hits_total, _misses_total       counter
//   hsap_plan_cache_entries, hsap_plan_cache_bytes  gauge
//   hsap_plan_compile_seconds                       histogram
//   hsap_regions, hsap_region_bytes                 gauge
//   hsap_sessions                                   gauge
//   hsap_queue_depth                                gauge (calls waiting)
//   hsap_device_busy_seconds_total{device}          counter
//   hsap_limit{limit}                               gauge (each cap's value)
//   hsap_limit_refusals_total{limit}                counter (requests a cap refused)
//   hsap_region_mappings                            gauge (live client mappings)
//   hsap_call_groups                                gauge (groups the matcher tracks)
//   hsap_kernel_scratch_cached_bytes                gauge (free CPU kernel scratch kept)
//   hsap_groups{state}                              gauge (multi-node groups: FORMING, UP, FAILED)
//   hsap_peers{state}                               gauge (run-time peers: JOINING, UP, SUSPECT, DOWN)
//   hsap_build_info{version}                        gauge, always 1
//
// Thread-safety: every method is thread-safe and, after a series' first
// use, lock-free (SetPlanCacheStats takes a small mutex of its own).
//
// Example (daemon wiring):
//   metrics::Registry registry;
//   metrics::HsapMetrics hsap_metrics(&registry, {.devices = {"cpu:0", "cpu:1"}});
//   ... after each call:
//   hsap_metrics.RecordCall(metrics::CallOp::kForward, plan::StrategyName(s),
//                           status.code(), seconds);
#ifndef HSAP_SERVER_METRICS_HSAP_METRICS_H_
#define HSAP_SERVER_METRICS_HSAP_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/version.h"
#include "server/metrics/registry.h"

namespace hsap::metrics {

// Label values ("forward", "backward").
enum class CallOp : uint8_t { kForward = 0, kBackward = 1 };
// "sent", "received".
enum class TransferDirection : uint8_t { kSent = 0, kReceived = 1 };
// "intra_node", "inter_node" (the order of transport::Tier and plan::LinkTier).
enum class LinkTier : uint8_t { kIntraNode = 0, kInterNode = 1 };

// The strategy label values RecordCall keeps (plan::StrategyName's words);
// any other string is recorded as "other".
inline constexpr std::array<absl::string_view, 7> kStrategyLabels = {
    "ring", "allgather", "ulysses", "usp", "sap", "hsap", "auto"};

// The limit label values: hsapd's flag names of its caps
// (docs/reliability.md lists them with their defaults).
inline constexpr std::array<absl::string_view, 13> kLimitLabels = {
    "max_sessions",          "max_pending_fds_per_session", "max_regions_per_session",
    "max_regions",           "max_region_bytes_per_session", "max_region_bytes",
    "max_region_mappings",   "max_call_groups",              "plan_cache_bytes",
    "max_message_bytes",     "max_tcp_message_bytes",        "max_peers",
    "kernel_scratch_cache_bytes"};

struct HsapMetricsOptions {
  // Label values of hsap_device_busy_seconds_total, one per device slot of
  // the daemon ("cpu:0", "gpu:1"); RecordDeviceBusy indexes this list.
  std::vector<std::string> devices;
  // hsap_build_info's version label.
  std::string version = kVersion;
  // Buckets of hsap_call_duration_seconds (100 us .. 60 s by default).
  BucketBoundaries call_buckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                   0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                   5,      10,      30,     60};
  // Buckets of hsap_plan_compile_seconds (10 us .. 10 s by default).
  BucketBoundaries compile_buckets = {0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005,
                                      0.01,    0.05,    0.1,    0.5,    1,     5,
                                      10};
};

// What SetPlanCacheStats reads: the plan cache's cumulative counts and its
// current size (plan::PlanCacheStats' fields of the same names).
struct PlanCacheSnapshot {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t entries = 0;
  int64_t bytes = 0;
};

class HsapMetrics {
 public:
  // Registers the families on `registry` and creates the series whose label
  // sets are known now (so they read 0 before anything happens).
  // REQUIRES: `registry` outlives this object; one HsapMetrics per registry
  // (a second one would share the same families and double-count the
  // plan cache). Aborts if the names clash with families already there.
  HsapMetrics(Registry* registry, HsapMetricsOptions options);
  HsapMetrics(const HsapMetrics&) = delete;
  HsapMetrics& operator=(const HsapMetrics&) = delete;

  // One attention call finished (any status): counts it in
  // hsap_calls_total{op, strategy, status} and observes `seconds` (clamped
  // at 0) in hsap_call_duration_seconds{op}. `strategy` outside
  // kStrategyLabels reads "other"; `code` reads as absl's name ("OK",
  // "INVALID_ARGUMENT", ...), an out-of-range code as "UNKNOWN".
  void RecordCall(CallOp op, absl::string_view strategy, absl::StatusCode code, double seconds);

  // `bytes` (>= 0; negative is ignored) moved by the transport.
  void RecordTransfer(TransferDirection direction, LinkTier tier, int64_t bytes);

  // Publishes the plan cache's state: hits and misses are cumulative counts
  // of the cache, and the counters advance by the increase since the last
  // call (a decrease, as after a cache reset, re-bases without counting);
  // entries and bytes set the gauges. Call it after lookups or on a timer.
  void SetPlanCacheStats(const PlanCacheSnapshot& stats) ABSL_LOCKS_EXCLUDED(cache_mu_);

  // One plan compilation took `seconds`.
  void RecordPlanCompile(double seconds);

  // Registered regions and their total bytes, across sessions.
  void SetRegions(int64_t count, int64_t bytes);
  // Open client sessions.
  void SetSessions(int64_t count);
  // Calls waiting to run: set it, or move it by `delta` at enqueue (+1) and
  // dequeue (-1).
  void SetQueueDepth(int64_t depth);
  void AddQueueDepth(int64_t delta);

  // Device slot `device` (an index into options.devices) was busy for
  // `seconds`. An index out of range is ignored (and returns false).
  bool RecordDeviceBusy(int device, double seconds);

  // The value of cap `limit` (one of kLimitLabels; others are ignored and
  // return false).
  bool SetLimit(absl::string_view limit, double value);
  // Cap `limit` refused a request (kLimitLabels; others are ignored).
  bool RecordLimitRefusal(absl::string_view limit);
  // Live client mappings and call groups.
  void SetRegionMappings(int64_t count);
  void SetCallGroups(int64_t count);
  // Bytes of free CPU kernel scratch blocks kept for the next call
  // (kernels::cpu::ScratchCacheBytes).
  void SetKernelScratchBytes(int64_t bytes);
  // Multi-node groups by state (FORMING, UP, FAILED) and run-time peers by
  // state (JOINING, UP, SUSPECT, DOWN): Cluster::GroupCounts / PeerCounts.
  void SetPeerLayer(const std::array<int, 3>& groups, const std::array<int, 4>& peers);

 private:
  static constexpr int kNumOps = 2;
  static constexpr int kNumStrategies = kStrategyLabels.size() + 1;  // + "other"
  static constexpr int kNumCodes = 17;  // absl::StatusCode 0..16

  Counter& CallCounter(CallOp op, int strategy, int code);

  Family<Counter>& calls_;
  // Series of calls_ by (op, strategy, code), filled on first use so that
  // only label sets that happened are exported.
  std::array<std::atomic<Counter*>, kNumOps * kNumStrategies * kNumCodes> call_series_{};
  std::array<Histogram*, kNumOps> call_duration_;
  std::array<Counter*, 4> transfer_bytes_;  // [direction * 2 + tier]
  Counter& cache_hits_;
  Counter& cache_misses_;
  Gauge& cache_entries_;
  Gauge& cache_bytes_;
  Histogram& compile_seconds_;
  Gauge& regions_;
  Gauge& region_bytes_;
  Gauge& sessions_;
  Gauge& queue_depth_;
  std::vector<Counter*> device_busy_;
  std::array<Gauge*, kLimitLabels.size()> limit_values_{};
  std::array<Counter*, kLimitLabels.size()> limit_refusals_{};
  Gauge& region_mappings_;
  Gauge& call_groups_;
  Gauge& kernel_scratch_bytes_;
  std::array<Gauge*, 3> groups_by_state_{};
  std::array<Gauge*, 4> peers_by_state_{};

  absl::Mutex cache_mu_;
  PlanCacheSnapshot last_cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace hsap::metrics

#endif  // HSAP_SERVER_METRICS_HSAP_METRICS_H_

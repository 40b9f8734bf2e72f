#include "server/metrics/hsap_metrics.h"

#include <algorithm>

namespace hsap::metrics {
namespace {

constexpr absl::string_view kOpLabels[] = {"forward", "backward"};
constexpr absl::string_view kDirectionLabels[] = {"sent", "received"};
constexpr absl::string_view kTierLabels[] = {"intra_node", "inter_node"};

int StrategyIndex(absl::string_view strategy) {
  for (size_t i = 0; i < kStrategyLabels.size(); ++i) {
    if (kStrategyLabels[i] == strategy) return static_cast<int>(i);
  }
  return static_cast<int>(kStrategyLabels.size());  // "other"
}

absl::string_view StrategyLabel(int index) {
  return index < static_cast<int>(kStrategyLabels.size()) ? kStrategyLabels[index] : "other";
}

Family<Counter>& Calls(Registry* registry) {
  return BuildCounter()
      .Name("hsap_calls_total")
      .Help("Attention calls finished, by operation, strategy that ran, and status code.")
      .Register(*registry);
}

Gauge& UnlabelledGauge(Registry* registry, const char* name, const char* help) {
  return BuildGauge().Name(name).Help(help).Register(*registry).Add({});
}

Counter& UnlabelledCounter(Registry* registry, const char* name, const char* help) {
  return BuildCounter().Name(name).Help(help).Register(*registry).Add({});
}

}  // namespace

HsapMetrics::HsapMetrics(Registry* registry, HsapMetricsOptions options)
    : calls_(Calls(registry)),
      cache_hits_(UnlabelledCounter(registry, "hsap_plan_cache_hits_total",
                                    "Plan cache lookups that found a compiled plan.")),
      cache_misses_(UnlabelledCounter(registry, "hsap_plan_cache_misses_total",
                                      "Plan cache lookups that compiled a plan.")),
      cache_entries_(UnlabelledGauge(registry, "hsap_plan_cache_entries", "Plans in the cache.")),
      cache_bytes_(UnlabelledGauge(registry, "hsap_plan_cache_bytes",
                                   "Approximate bytes of the plans in the cache.")),
      compile_seconds_(BuildHistogram()
                           .Name("hsap_plan_compile_seconds")
                           .Help("Time to compile one plan.")
                           .Buckets(options.compile_buckets)
                           .Register(*registry)
                           .Add({})),
      regions_(UnlabelledGauge(registry, "hsap_regions", "Registered shared-memory regions.")),
      region_bytes_(UnlabelledGauge(registry, "hsap_region_bytes",
                                    "Bytes of the registered shared-memory regions.")),
      sessions_(UnlabelledGauge(registry, "hsap_sessions", "Open client sessions.")),
      queue_depth_(UnlabelledGauge(registry, "hsap_queue_depth",
                                   "Attention calls waiting to run.")),
      region_mappings_(UnlabelledGauge(registry, "hsap_region_mappings",
                                       "Client memory mappings alive (regions, and unregistered "
                                       "ones a call still uses).")),
      call_groups_(UnlabelledGauge(registry, "hsap_call_groups",
                                   "Call groups the call matcher keeps state for.")),
      kernel_scratch_bytes_(UnlabelledGauge(
          registry, "hsap_kernel_scratch_cached_bytes",
          "Free CPU kernel scratch blocks kept for the next call (at most "
          "--kernel_scratch_cache_bytes).")) {
  Family<Gauge>& limits = BuildGauge()
                              .Name("hsap_limit")
                              .Help("The value of each cap, by its hsapd flag name.")
                              .Register(*registry);
  Family<Counter>& refusals = BuildCounter()
                                  .Name("hsap_limit_refusals_total")
                                  .Help("Requests refused RESOURCE_EXHAUSTED by a cap, by its "
                                        "hsapd flag name.")
                                  .Register(*registry);
  for (size_t i = 0; i < kLimitLabels.size(); ++i) {
    limit_values_[i] = &limits.Add({{"limit", std::string(kLimitLabels[i])}});
    limit_refusals_[i] = &refusals.Add({{"limit", std::string(kLimitLabels[i])}});
  }
  Family<Gauge>& groups = BuildGauge()
                              .Name("hsap_groups")
                              .Help("Multi-node groups this daemon takes part in, by state.")
                              .Register(*registry);
  const char* group_states[] = {"FORMING", "UP", "FAILED"};
  for (int i = 0; i < 3; ++i) groups_by_state_[i] = &groups.Add({{"state", group_states[i]}});
  Family<Gauge>& peers = BuildGauge()
                             .Name("hsap_peers")
                             .Help("Run-time peers (members of this daemon's groups, not "
                                   "--peers) this daemon references, by state.")
                             .Register(*registry);
  const char* peer_states[] = {"JOINING", "UP", "SUSPECT", "DOWN"};
  for (int i = 0; i < 4; ++i) peers_by_state_[i] = &peers.Add({{"state", peer_states[i]}});
  Family<Histogram>& duration = BuildHistogram()
                                    .Name("hsap_call_duration_seconds")
                                    .Help("Attention call latency, from arrival to reply.")
                                    .Buckets(options.call_buckets)
                                    .Register(*registry);
  for (int op = 0; op < kNumOps; ++op) {
    call_duration_[op] = &duration.Add({{"op", std::string(kOpLabels[op])}});
  }

  Family<Counter>& transfer =
      BuildCounter()
          .Name("hsap_transfer_bytes_total")
          .Help("Bytes the data plane moved, by direction and link tier.")
          .Register(*registry);
  for (int direction = 0; direction < 2; ++direction) {
    for (int tier = 0; tier < 2; ++tier) {
      transfer_bytes_[direction * 2 + tier] =
          &transfer.Add({{"direction", std::string(kDirectionLabels[direction])},
                         {"tier", std::string(kTierLabels[tier])}});
    }
  }

  Family<Counter>& busy = BuildCounter()
                              .Name("hsap_device_busy_seconds_total")
                              .Help("Seconds each device slot spent running attention work.")
                              .Register(*registry);
  for (const std::string& device : options.devices) {
    device_busy_.push_back(&busy.Add({{"device", device}}));
  }

  BuildGauge()
      .Name("hsap_build_info")
      .Help("The running hsapd's version; the value is always 1.")
      .Register(*registry)
      .Add({{"version", options.version}})
      .Set(1);
}

Counter& HsapMetrics::CallCounter(CallOp op, int strategy, int code) {
  const int op_index = static_cast<int>(op) == 1 ? 1 : 0;
  std::atomic<Counter*>& slot =
      call_series_[(op_index * kNumStrategies + strategy) * kNumCodes + code];
  Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {
    counter = &calls_.Add({{"op", std::string(kOpLabels[op_index])},
                           {"strategy", std::string(StrategyLabel(strategy))},
                           {"status", absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}});
    slot.store(counter, std::memory_order_release);
  }
  return *counter;
}

void HsapMetrics::RecordCall(CallOp op, absl::string_view strategy, absl::StatusCode code,
                             double seconds) {
  int code_index = static_cast<int>(code);
  if (code_index < 0 || code_index >= kNumCodes) code_index = static_cast<int>(absl::StatusCode::kUnknown);
  CallCounter(op, StrategyIndex(strategy), code_index).Increment();
  call_duration_[static_cast<int>(op) == 1 ? 1 : 0]->Observe(std::max(seconds, 0.0));
}

void HsapMetrics::RecordTransfer(TransferDirection direction, LinkTier tier, int64_t bytes) {
  if (bytes < 0) return;
  const int d = direction == TransferDirection::kReceived ? 1 : 0;
  const int t = tier == LinkTier::kInterNode ? 1 : 0;
  transfer_bytes_[d * 2 + t]->Increment(static_cast<double>(bytes));
}

void HsapMetrics::SetPlanCacheStats(const PlanCacheSnapshot& stats) {
  {
    absl::MutexLock lock(&cache_mu_);
    if (stats.hits > last_cache_.hits) cache_hits_.Increment(stats.hits - last_cache_.hits);
    if (stats.misses > last_cache_.misses) {
      cache_misses_.Increment(stats.misses - last_cache_.misses);
    }
    last_cache_ = stats;
  }
  cache_entries_.Set(stats.entries);
  cache_bytes_.Set(stats.bytes);
}

void HsapMetrics::RecordPlanCompile(double seconds) {
  compile_seconds_.Observe(std::max(seconds, 0.0));
}

void HsapMetrics::SetRegions(int64_t count, int64_t bytes) {
  regions_.Set(count);
  region_bytes_.Set(bytes);
}

void HsapMetrics::SetSessions(int64_t count) { sessions_.Set(count); }

void HsapMetrics::SetQueueDepth(int64_t depth) { queue_depth_.Set(depth); }

void HsapMetrics::AddQueueDepth(int64_t delta) { queue_depth_.Increment(delta); }

bool HsapMetrics::RecordDeviceBusy(int device, double seconds) {
  if (device < 0 || device >= static_cast<int>(device_busy_.size())) return false;
  device_busy_[device]->Increment(seconds);
  return true;
}

namespace {
int LimitIndex(absl::string_view limit) {
  for (size_t i = 0; i < kLimitLabels.size(); ++i) {
    if (kLimitLabels[i] == limit) return static_cast<int>(i);
  }
  return -1;
}
}  // namespace

bool HsapMetrics::SetLimit(absl::string_view limit, double value) {
  const int i = LimitIndex(limit);
  if (i < 0) return false;
  limit_values_[i]->Set(value);
  return true;
}

bool HsapMetrics::RecordLimitRefusal(absl::string_view limit) {
  const int i = LimitIndex(limit);
  if (i < 0) return false;
  limit_refusals_[i]->Increment();
  return true;
}

void HsapMetrics::SetRegionMappings(int64_t count) { region_mappings_.Set(count); }
void HsapMetrics::SetKernelScratchBytes(int64_t bytes) {
  kernel_scratch_bytes_.Set(static_cast<double>(bytes));
}

void HsapMetrics::SetCallGroups(int64_t count) { call_groups_.Set(count); }

void HsapMetrics::SetPeerLayer(const std::array<int, 3>& groups, const std::array<int, 4>& peers) {
  for (int i = 0; i < 3; ++i) groups_by_state_[i]->Set(groups[i]);
  for (int i = 0; i < 4; ++i) peers_by_state_[i]->Set(peers[i]);
}

}  // namespace hsap::metrics

// The parts of one hsapd that outlive a call: regions, sessions, the call
// gate, the device slots, the plan cache, the call matcher and runner, and
// the metrics. Owned by Daemon (daemon.h), which hands each gRPC service the
// few parts it uses (server/grpc/services.h). Thread-safe through its parts.
#ifndef HSAP_SERVER_DAEMON_STATE_H_
#define HSAP_SERVER_DAEMON_STATE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "server/exec/attention_call.h"
#include "server/exec/call_gate.h"
#include "server/exec/call_matcher.h"
#include "server/exec/call_runner.h"
#include "server/exec/device_slots.h"
#include "server/exec/measured_profile.h"
#include "server/metrics/hsap_metrics.h"
#include "server/metrics/registry.h"
#include "server/plan/plan_cache.h"
#include "server/shm/region_registry.h"
#include "server/shm/session_manager.h"

namespace hsap {

struct DaemonState {
  // `cpu_threads` kernel threads are split among the device slots.
  // Call memory is reserved from a budget of `memory_budget_bytes`.
  DaemonState(int cpu_threads, const CallRunnerOptions& runner_options,
              const std::vector<std::string>& devices, shm::RegionLimits region_limits = {},
              int plan_compile_threads = 1,
              int64_t memory_budget_bytes = exec::DefaultMemoryBudgetBytes(),
              double paced_flops_per_s = 0)
      : metrics(&metrics_registry, metrics::HsapMetricsOptions{devices}),
        regions(region_limits),
        sessions(&regions),
        memory(memory_budget_bytes),
        slots(exec::DeviceSlots::Cpu(static_cast<int>(devices.size()),
                                     cpu_threads / std::max<int>(1, devices.size()), &memory,
                                     paced_flops_per_s)),
        measured(slots.get()),
        plans(plan::PlanCacheOptions{.compile_threads = plan_compile_threads}),
        matcher(CallResources(runner_options)),
        runner(WithMeasured(runner_options, &measured), &plans, &matcher, &active, slots.get()) {}

  static CallRunnerOptions WithMeasured(CallRunnerOptions o, exec::MeasuredProfiles* measured) {
    o.measured = measured;
    return o;
  }

  // Refreshes the gauges that mirror other parts' state (regions, sessions,
  // plan cache); called after each call and region change.
  void RefreshGauges() {
    // hardening: counters, not List() (which copied every session's regions
    // on every registration: cost grew with other sessions' regions).
    metrics.SetRegions(static_cast<int64_t>(regions.num_regions()),
                       static_cast<int64_t>(regions.total_bytes()));
    metrics.SetRegionMappings(static_cast<int64_t>(regions.live_mappings()));
    metrics.SetCallGroups(matcher.num_groups());
    metrics.SetKernelScratchBytes(static_cast<int64_t>(kernels::cpu::ScratchCacheBytes()));
    if (cluster != nullptr) metrics.SetPeerLayer(cluster->GroupCounts(), cluster->PeerCounts());
    metrics.SetSessions(sessions.num_sessions());
    const plan::PlanCacheStats s = plans.Stats();
    metrics.SetPlanCacheStats({s.hits, s.misses, s.entries, s.bytes});
  }

  // Metrics first: everything below may record into them.
  metrics::Registry metrics_registry;
  metrics::HsapMetrics metrics;
  shm::RegionRegistry regions;
  shm::SessionManager sessions;
  CallGate gate;
  ValidationLimits limits;
  // The peer layer (groups and run-time peers), for the gauges; null
  // without TCP. Owned by the Daemon.
  cluster::Cluster* cluster = nullptr;
  exec::MemoryBudget memory;  // --memory_budget_bytes
  // One compute backend per device slot.
  std::unique_ptr<exec::DeviceSlots> slots;
  // What this daemon measured of itself (--profile=measured).
  exec::MeasuredProfiles measured;
  plan::PlanCache plans;
  CallMatcher matcher;
  ActiveCalls active;
  CallRunner runner;
};

}  // namespace hsap

#endif  // HSAP_SERVER_DAEMON_STATE_H_

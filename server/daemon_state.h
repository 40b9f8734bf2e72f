// Everything the services of one hsapd share: regions, sessions, the call
// gate, compute resources and configuration. Owned by Daemon (daemon.h);
// services and tests get a pointer. Thread-safe through its parts.
#ifndef HSAP_SERVER_DAEMON_STATE_H_
#define HSAP_SERVER_DAEMON_STATE_H_

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "server/exec/call_gate.h"
#include "server/metrics/hsap_metrics.h"
#include "server/metrics/registry.h"
#include "server/exec/call_matcher.h"
#include "server/exec/call_runner.h"
#include "server/exec/device_slots.h"
#include "server/plan/plan_cache.h"
#include "server/grpc/attention_validation.h"
#include "server/shm/region_registry.h"
#include "server/shm/session_manager.h"

namespace hsap {

struct DaemonState {
  // Metrics first: everything below may record into them.
  metrics::Registry metrics_registry;
  metrics::HsapMetrics metrics;
  std::vector<std::string> device_names;  // "cpu:0", ...

  DaemonState(int cpu_threads, const CallRunnerOptions& runner_options,
              const std::vector<std::string>& devices, shm::RegionLimits region_limits = {},
              int plan_compile_threads = 1)
      : metrics(&metrics_registry, metrics::HsapMetricsOptions{devices}),
        device_names(devices),
        regions(region_limits),
        sessions(&regions),
        slots(exec::DeviceSlots::Cpu(static_cast<int>(devices.size()),
                                     cpu_threads / std::max<int>(1, devices.size()))),
        plans(plan::PlanCacheOptions{.compile_threads = plan_compile_threads}),
        matcher(CallResources(runner_options)),
        runner(runner_options) {}

  shm::RegionRegistry regions;
  shm::SessionManager sessions;
  CallGate gate;
  // One compute backend per device slot; cpu_threads are split among them.
  std::unique_ptr<exec::DeviceSlots> slots;
  ValidationLimits limits;
  // The token TCP calls must carry (--token_file); empty: TCP is open.
  // Set before the gRPC server starts, read-only afterwards.
  std::string tcp_token;

  // Refreshes the gauges that mirror other parts' state (regions, sessions,
  // plan cache); called after each call and region change.
  void RefreshGauges() {
    // hardening: counters, not List() (which copied every session's regions
    // on every registration: cost grew with other sessions' regions).
    metrics.SetRegions(static_cast<int64_t>(regions.num_regions()),
                       static_cast<int64_t>(regions.total_bytes()));
    metrics.SetRegionMappings(static_cast<int64_t>(regions.live_mappings()));
    metrics.SetCallGroups(matcher.num_groups());
    metrics.SetSessions(sessions.num_sessions());
    const plan::PlanCacheStats s = plans.Stats();
    metrics.SetPlanCacheStats({s.hits, s.misses, s.entries, s.bytes});
  }
  plan::PlanCache plans;
  CallMatcher matcher;
  const CallRunnerOptions runner;
  ActiveCalls active;
  std::atomic<uint64_t> calls_total{0};
  std::atomic<uint64_t> busy_micros{0};
};

}  // namespace hsap

#endif  // HSAP_SERVER_DAEMON_STATE_H_

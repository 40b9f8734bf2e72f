// Everything the services of one hsapd share: regions, sessions, the call
// gate, compute resources and configuration. Owned by Daemon (daemon.h);
// services and tests get a pointer. Thread-safe through its parts.
#ifndef HSAP_SERVER_DAEMON_STATE_H_
#define HSAP_SERVER_DAEMON_STATE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "server/exec/call_gate.h"
#include "server/exec/call_matcher.h"
#include "server/exec/call_runner.h"
#include "server/plan/plan_cache.h"
#include "server/grpc/attention_validation.h"
#include "server/shm/region_registry.h"
#include "server/shm/session_manager.h"

namespace hsap {

struct DaemonState {
  DaemonState(int cpu_threads, const CallRunnerOptions& runner_options,
              shm::RegionLimits region_limits = {})
      : regions(region_limits),
        sessions(&regions),
        pool(cpu_threads),
        matcher(CallResources(runner_options)),
        runner(runner_options) {}

  shm::RegionRegistry regions;
  shm::SessionManager sessions;
  CallGate gate;
  kernels::cpu::ThreadPool pool;
  ValidationLimits limits;
  plan::PlanCache plans;
  CallMatcher matcher;
  const CallRunnerOptions runner;
  ActiveCalls active;
  std::vector<std::string> device_names;  // "cpu:0", ...
  std::atomic<uint64_t> calls_total{0};
  std::atomic<uint64_t> busy_micros{0};
};

}  // namespace hsap

#endif  // HSAP_SERVER_DAEMON_STATE_H_

#!/usr/bin/env bash
# Runs the CPU test suite under the sanitizers (docs/reliability.md):
#   1. AddressSanitizer + UndefinedBehaviorSanitizer: every unit and
#      integration test (GPU tests excluded by --config=cpu, tests tagged
#      no_sanitizers too). Tests that
#      start hsapd run the sanitized binary (it is a data dependency).
#   2. ThreadSanitizer: the concurrency tests — call matcher, plan cache,
#      region registry, transports, executor, plan agreement, metrics
#      registry and exposer, kernel thread pool, the measured profiles
#      (callers sharing one measurement), the numerics test (the
#      kernels' waves on two threads, ranks on threads). Not cluster_test nor
#      group_formation_test: their in-process gRPC traffic is synchronized
#      inside uninstrumented gRPC (tests/sanitizers/tsan.supp explains; both
#      report races in gRPC/protobuf frames only, then crash inside the
#      uninstrumented libraries when run with halt_on_error=0).
# The two runs are sequential (each takes both cores). Outputs live in
# bazel-out/k8-opt-asan and k8-opt-tsan (--platform_suffix), so the plain
# build is not disturbed. Extra arguments go to both bazel invocations.
# Usage: scripts/sanitizers.sh [asan|tsan|all] [bazel args...]
set -euo pipefail
cd "$(dirname "$0")/.."

TSAN_TARGETS=(
  //server/exec:call_matcher_test
  //server/exec:executor_test
  //server/plan:plan_cache_test
  //server/shm:shm_test
  //server/transport:inprocess_transport_test
  //server/transport:ucx_transport_test
  //server/transport:comm_ids_test
  //server/cluster:plan_agreement_test
  //server/metrics:http_exposer_test
  //server/metrics:registry_test
  //common:thread_pool_test
  //server/plan:compiler_pool_test
  //server/exec:measured_profile_test
  //tests/numerics:numerics_test
)

which=${1:-all}
[ $# -gt 0 ] && shift
status=0
run() {
  local name=$1
  shift
  local start=$SECONDS
  echo "sanitizers: ${name}: bazel test $*"
  bazel test --keep_going "$@" || status=$?
  echo "sanitizers: ${name} took $((SECONDS - start)) s"
}
if [ "$which" = all ] || [ "$which" = asan ]; then
  # Tests tagged no_sanitizers (tests/e2e:fresh_clone_test, a cold build of
  # a fresh clone) gain nothing from instrumentation.
  run asan --config=asan --config=cpu --test_tag_filters=-gpu,-no_sanitizers "$@" -- //...
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  run tsan --config=tsan --config=cpu "$@" -- "${TSAN_TARGETS[@]}"
fi
exit $status

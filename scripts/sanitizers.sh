#!/usr/bin/env bash
# Runs the sanitizer stages of command two (docs/reliability.md, "Where
# tests run"):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer on the tests of the
#         code that touches memory a caller or a peer controls: the regions
#         and sessions (server/shm), the transports, the executor and call
#         path (server/exec), the gRPC entry points, the peer layer
#         (server/cluster), the metrics HTTP server, the CPU kernels, common,
#         and the integration tests that drive a real hsapd with hostile or
#         heavy input (ASAN_INTEGRATION below). Not the planner's unit
#         tests (server/plan): pure computation on validated inputs, which
#         reach the compiler under ASan through the integration tests'
#         hostile requests and tests/fuzz/plan_compiler_fuzzer. Tests that
#         start hsapd run the sanitized binary (it is a data dependency).
#         Long sweeps keep one case in five (tests/sanitizers/sweep.h).
#   tsan  ThreadSanitizer on the concurrency tests (TSAN_TARGETS below);
#         long sweeps keep one case in twenty. Not
#         cluster_test nor group_formation_test: their in-process gRPC
#         traffic is synchronized inside uninstrumented gRPC
#         (tests/sanitizers/tsan.supp explains).
# A new test in one of the ASAN_PACKAGES runs under ASan without being
# listed; tests elsewhere join a list here when they exercise such memory.
# Tests tagged no_sanitizers (the fresh-clone test) never run here. The two
# runs are sequential (each takes both cores); their outputs live in
# bazel-out/k8-optasan and k8-opttsan (--platform_suffix), so the plain
# build is not disturbed. Both build only what their tests need
# (--build_tests_only). Extra arguments go to both bazel invocations.
# Usage: scripts/sanitizers.sh [asan|tsan|all] [bazel args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Every test under these packages.
ASAN_PACKAGES=(
  //common/...
  //kernels/cpu/...
  //server/shm/...
  //server/transport/...
  //server/exec/...
  //server/grpc/...
  //server/cluster/...
  //server/metrics/...
)
# ...less the tests that time the kernels (a sanitizer would time its own
# instrumentation; the plain stage runs them, TSan checks their threads).
ASAN_EXCLUDED=(
  //server/exec:measured_profile_test
)
# Integration tests: a real daemon under hostile input, load, cancellation,
# several daemons and run-time groups; the numerics suite (the kernels and
# the executor over random cases, one in five under a sanitizer); the Python
# client's hostile inputs.
ASAN_INTEGRATION=(
  //tests/integration:hardening_test
  //tests/integration:bad_inputs_test
  //tests/integration:bad_requests_test
  //tests/integration:load_test
  //tests/integration:call_control_test
  //tests/integration:daemon_process_test
  //tests/integration:multirank_test
  //tests/integration:cluster_test
  //tests/integration:tcp_auth_test
  //tests/integration:peer_trust_test
  //tests/integration:job_groups_test
  //tests/numerics:numerics_test
  //client/python:bad_inputs_test
)

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
  //kernels/cpu:task_waves_test
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
  local profile=()
  # HSAP_BAZEL_PROFILE (scripts/test.sh sets it per stage): Bazel's profile.
  [ -n "${HSAP_BAZEL_PROFILE:-}" ] && profile=(--profile="$HSAP_BAZEL_PROFILE")
  echo "sanitizers: ${name}: bazel test $*"
  bazel test --keep_going "${profile[@]}" "$@" || status=$?
  echo "sanitizers: ${name} took $((SECONDS - start)) s"
}
if [ "$which" = all ] || [ "$which" = asan ]; then
  excluded=()
  for t in "${ASAN_EXCLUDED[@]}"; do excluded+=("-$t"); done
  run asan --config=asan --config=cpu --test_tag_filters=-gpu,-no_sanitizers \
    --build_tests_only "$@" -- \
    "${ASAN_PACKAGES[@]}" "${ASAN_INTEGRATION[@]}" "${excluded[@]}"
fi
if [ "$which" = all ] || [ "$which" = tsan ]; then
  run tsan --config=tsan --config=cpu --build_tests_only "$@" -- "${TSAN_TARGETS[@]}"
fi
exit $status

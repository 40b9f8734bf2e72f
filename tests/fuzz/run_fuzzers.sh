#!/usr/bin/env bash
# Builds (tests/fuzz/build.sh) and runs every libFuzzer target for SECONDS
# each, printing executions per target; fails on any crash, leak, timeout or
# sanitizer report (libFuzzer exits non-zero and leaves the input under
# $HSAP_FUZZ_OUT/artifacts/).
#
# Usage: tests/fuzz/run_fuzzers.sh SECONDS [target...]
#   JOBS=2 runs two targets at a time (default 1).
#   RUNS=1000000 also stops each target after that many executions
#   (SECONDS stays the cap).
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>/)
# plus what earlier runs found ($HSAP_FUZZ_OUT/corpus/<target>/, kept
# between runs; new inputs go there, never into the committed seeds).
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:?usage: run_fuzzers.sh SECONDS [target...]}
shift
OUT=${HSAP_FUZZ_OUT:-/tmp/hsap-fuzz}
JOBS=${JOBS:-1}
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(mask_fuzzer attention_validation_fuzzer register_region_fuzzer
  plan_spec_fuzzer plan_compiler_fuzzer peer_protocol_fuzzer metrics_http_fuzzer session_socket_fuzzer
  group_join_fuzzer group_profile_fuzzer link_probe_fuzzer peer_tls_fuzzer)

tests/fuzz/build.sh "${TARGETS[@]}"
mkdir -p "$OUT/artifacts" "$OUT/logs"

run_one() {
  local t=$1 seeds=tests/fuzz/corpus/$1
  mkdir -p "$OUT/corpus/$t"
  [ -d "$seeds" ] || seeds=""
  local log="$OUT/logs/$t.log"
  local rc=0
  # -timeout: one input may take at most 25 s (the metrics target waits on
  # sockets); -rss_limit_mb: the plan checker is O(T^2) in memory too.
  "$OUT/bin/$t" -max_total_time="$SECONDS_EACH" ${RUNS:+-runs=$RUNS} -timeout=25 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t-" \
    "$OUT/corpus/$t" $seeds >"$log" 2>&1 || rc=$?
  local execs secs
  execs=$(grep -ao 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  secs=$(grep -ao 'Done [0-9]* runs in [0-9]* second' "$log" | awk '{print $5}' | tail -1)
  printf '%-30s %12s execs %6s s %6s corpus %s\n' "$t" "${execs:-?}" "${secs:-$SECONDS_EACH}" \
    "$(ls "$OUT/corpus/$t" | wc -l)" "$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see $log)")"
  return $rc
}
export -f run_one
# UCX's own leaks (see the file) are not the project's.
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# A 32 MiB quarantine (ASan's default is 256 MiB) and no 0xbe fill of new
# blocks: the OpenSSL- and gRPC-heavy targets spent half their time in page
# faults cycling through the larger quarantine (peer_tls_fuzzer: 400
# certificates in 2.2 s instead of 4.4 s). A use after free is still caught
# while 32 MiB of later frees have not recycled the block, which spans
# many inputs here. Give ASAN_OPTIONS to choose otherwise.
export ASAN_OPTIONS="${ASAN_OPTIONS:-quarantine_size_mb=32:max_malloc_fill_size=0}"
export OUT SECONDS_EACH RUNS

status=0
printf '%s\n' "${TARGETS[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one {}' || status=$?
if [ $status -ne 0 ]; then
  echo "run_fuzzers: a target failed; crashing inputs:" >&2
  ls -l "$OUT/artifacts" >&2
  grep -h -A3 -E 'ERROR: |runtime error|check failed' "$OUT"/logs/*.log | head -40 >&2 || true
fi
exit $status

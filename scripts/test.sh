#!/usr/bin/env bash
# Command two: set up and run the whole CPU test suite (GPU tests, tagged
# "gpu", are filtered out; they run where a GPU is present), then the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer and the
# concurrency tests under ThreadSanitizer (scripts/sanitizers.sh,
# docs/reliability.md). HSAP_SKIP_SANITIZERS=1 skips the sanitizer runs for
# a quick local pass; CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
out=$(mktemp /tmp/hsap-test.XXXXXX.log)
status=0
bazel test --config=cpu --keep_going //... "$@" 2>&1 | tee "$out" || status=$?
passed=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$out" || true)
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$out" || true)
echo "hsap tests: ${passed} passed, ${failed} failed"
if [ "${HSAP_SKIP_SANITIZERS:-0}" != 1 ]; then
  san=$(mktemp /tmp/hsap-sanitizers.XXXXXX.log)
  bash scripts/sanitizers.sh all 2>&1 | tee "$san" || status=$?
  spassed=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$san" || true)
  sfailed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$san" || true)
  echo "hsap tests: ${passed} passed, ${failed} failed"
  echo "hsap sanitizer tests (asan+ubsan, tsan): ${spassed} passed, ${sfailed} failed"
fi
exit $status

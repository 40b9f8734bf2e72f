#!/usr/bin/env bash
# Command two: set up and run the whole CPU test suite (GPU tests, tagged
# "gpu", are filtered out; they run where a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
out=$(mktemp /tmp/hsap-test.XXXXXX.log)
status=0
bazel test --config=cpu --keep_going //... "$@" 2>&1 | tee "$out" || status=$?
passed=$(grep -cE '^//\S+\s+(\(cached\) )?PASSED' "$out" || true)
failed=$(grep -cE '^//\S+\s+(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)' "$out" || true)
echo "hsap tests: ${passed} passed, ${failed} failed"
exit $status

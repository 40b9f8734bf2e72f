#!/usr/bin/env bash
# //examples:llama_cp_test — the short version of examples/llama_cp/run.py
# (6 steps of 1,024 tokens, 2 layers; fp32; each run starts its own two
# hsapd and two torchruns of 2 processes), three times:
#
#   1. as is, with a checkpoint after step 3 and a resumed run: CHECK PASSED;
#   2. --fault=scale (softmax scale x 1.1 in the context-parallel run): must
#      print CHECK FAILED;
#   3. --fault=position (local row numbers as rotary positions): must print
#      CHECK FAILED.
#
# The test fails unless all three verdicts are the expected ones. The
# reference run is made once and reused ($TEST_TMPDIR/references). Outside
# Bazel it runs from the source tree (bazel-bin/server/hsapd, or $HSAPD).
set -uo pipefail

if [[ -n "${TEST_SRCDIR:-}" ]]; then  # under bazel test: the runfiles tree
  root="$TEST_SRCDIR/hsap"
  export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
  export HSAPD="${HSAPD:-$root/server/hsapd}"
  work="${TEST_TMPDIR:?}"
else
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  export PYTHONPATH="$root/client/python:$root/bazel-bin/client/python${PYTHONPATH:+:$PYTHONPATH}"
  work="$(mktemp -d /tmp/hsap-llama-ci-XXXXXX)"
fi
export PYTHONDONTWRITEBYTECODE=1
python="${PYTHON:-/usr/bin/python3}"
short=(--steps=6 --tokens=1024 --layers=2 --no-bf16 --timeout-s=100
       --reference-dir="$work/references")

status=0
# run <name> <expected verdict> [run.py flags]
run() {
  local name="$1" want="$2"
  shift 2
  local started=$SECONDS
  "$python" "$root/examples/llama_cp/run.py" "${short[@]}" --out-dir="$work/$name" "$@" \
    >"$work/$name.log" 2>&1
  local got
  got="$(tail -n 1 "$work/$name.log")"
  if [[ "$got" == "$want" ]]; then
    echo "== $name: $got, as expected ($((SECONDS - started)) s)"
    grep -E "^(fp32|resume|FAILED)" "$work/$name.log" | sed 's/^/   /'
  else
    echo "== $name: expected $want, got '$got' ($((SECONDS - started)) s); its output:"
    cat "$work/$name.log"
    status=1
  fi
}

run normal "CHECK PASSED" --save-at=3
run fault-scale "CHECK FAILED" --fault=scale
run fault-position "CHECK FAILED" --fault=position
exit "$status"

#!/bin/bash
# The GPU check of the CUDA kernels, in one run of at most ~8 minutes, for a
# machine with one GPU (an H200), CUDA and PyTorch 2.x, and no network.
#
#   tests/gpu/device_check.sh                 # from the repository root
#   OUT=/some/dir tests/gpu/device_check.sh   # logs and the table copied there
#   HSAP_PREBUILT=dir tests/gpu/device_check.sh   # binaries staged by
#       tests/gpu/stage_prebuilt.sh on a machine with bazel: the lent GPU
#       machines have CUDA and PyTorch but no bazel, abseil or gtest
#
# Steps (each under its own timeout):
#   1. build   the prebuilt binaries of $HSAP_PREBUILT when set, else a bazel
#              build of //kernels/cuda/... //tests/gpu/... //server/gpu/...
#   2. gpu?    is a GPU visible (nvidia-smi, else PyTorch)? if not, say
#              so and stop after the build: nothing else can run
#   3. test    bazel test //tests/gpu/... //server/gpu/... //kernels/cuda/...,
#              gpu-tagged tests included (or the same tests, prebuilt)
#   4. bench   kernel_bench: T=16384 python-stdlib pack, bf16, H=16, D=128
#   5. torch   torch_flash_bench.py: torch's varlen flash on the same
#              cu_seqlens, and both errors against float64 on identical inputs
#   6. table   one table: ours (kernel alone, and whole call) vs torch TFLOP/s,
#              ratio (kernel alone / torch) against the targets
#              (0.8 forward, 0.7 backward), errors against tolerance, PASS/FAIL
# Exit status: 0 when every row passes, 1 otherwise, 2 when no GPU is visible.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOGS=$(mktemp -d /tmp/hsap_device_check.XXXXXX)
START=$(date +%s)
TOKENS=${TOKENS:-16384}
HEADS=${HEADS:-16}
HEAD_DIM=${HEAD_DIM:-128}
REPS=${REPS:-20}
WORKLOAD=${WORKLOAD:-$ROOT/workloads/python-stdlib.tokens}
PYTHON=${PYTHON:-python3}

note() { echo "[device_check +$(( $(date +%s) - START ))s] $*"; }
finish() {
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && cp "$LOGS"/*.log "$LOGS"/table.txt "$OUT"/ 2>/dev/null
    note "logs copied to $OUT"
  fi
  exit "$1"
}

# --- 1. build -----------------------------------------------------------------
MODE=none
if [ -n "${HSAP_PREBUILT:-}" ] && [ -x "$HSAP_PREBUILT/tests/kernel_test" ]; then
  MODE=prebuilt
  note "using prebuilt binaries from $HSAP_PREBUILT (tests/gpu/stage_prebuilt.sh)"
  # NCCL (server/gpu's tests) is not staged: use the one PyTorch ships.
  NCCL_LIB=$("$PYTHON" -c 'import os, nvidia.nccl as n
print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null | tail -1)
  export LD_LIBRARY_PATH="$HSAP_PREBUILT/lib${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  KERNEL_BENCH="$HSAP_PREBUILT/kernel_bench"
elif command -v bazel >/dev/null 2>&1; then
  MODE=bazel
  note "building with bazel (log: build.log)"
  if ! timeout 330 bazel build //kernels/cuda/... //tests/gpu/... //server/gpu/... \
      >"$LOGS/build.log" 2>&1; then
    tail -30 "$LOGS/build.log"
    note "FAIL: bazel build failed or timed out"
    echo "build FAIL" >"$LOGS/table.txt"
    finish 1
  fi
  KERNEL_BENCH="$ROOT/bazel-bin/tests/gpu/kernel_bench"
else
  note "FAIL: neither \$HSAP_PREBUILT (tests/gpu/stage_prebuilt.sh) nor bazel is available"
  finish 1
fi

# --- 2. is a GPU visible? --------------------------------------------------------
GPU=""
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
if [ -z "$GPU" ]; then
  GPU=$(timeout 60 "$PYTHON" -c 'import torch
print(torch.cuda.get_device_name() if torch.cuda.is_available() else "")' 2>/dev/null | tail -1)
fi
if [ -z "$GPU" ]; then
  note "build OK ($MODE); NO GPU VISIBLE on this machine: running only the tests that need none"
  CPU_TESTS=PASS
  if [ "$MODE" = bazel ]; then
    timeout 240 bazel test --config=cpu //kernels/cuda/... //tests/gpu/... //server/gpu/... \
      >"$LOGS/test.log" 2>&1 || CPU_TESTS=FAIL
    grep -E "(PASSED|FAILED|TIMEOUT|NO STATUS) in" "$LOGS/test.log"
  else
    for name in tiling_test fragment_layout_test attention_api_test device_info_test gpu_test; do
      [ -x "$HSAP_PREBUILT/tests/$name" ] || continue
      if timeout 120 "$HSAP_PREBUILT/tests/$name" >"$LOGS/$name.log" 2>&1; then
        echo "$name PASSED"
      else
        echo "$name FAILED (see $name.log)"
        CPU_TESTS=FAIL
      fi
    done
  fi
  {
    echo "kernel | result"
    echo "build ($MODE) | OK"
    echo "tests that need no GPU | $CPU_TESTS"
    echo "GPU tests, benchmark, torch comparison | NOT RUN: no GPU visible"
  } | tee "$LOGS/table.txt"
  finish 2
fi
note "GPU: $GPU"

# --- 3. tests ---------------------------------------------------------------------
TESTS=PASS
if [ "$MODE" = bazel ]; then
  note "bazel test (gpu-tagged included; log: test.log)"
  if ! timeout 240 bazel test //tests/gpu/... //server/gpu/... //kernels/cuda/... \
      --test_output=errors >"$LOGS/test.log" 2>&1; then
    TESTS=FAIL
  fi
  cp "$ROOT/bazel-testlogs/tests/gpu/kernel_test/test.log" "$LOGS/kernel_test.log" 2>/dev/null
else
  note "prebuilt tests (logs: <test>.log)"
  for t in "$HSAP_PREBUILT"/tests/*; do
    name=$(basename "$t")
    if timeout 240 "$t" >"$LOGS/$name.log" 2>&1; then
      echo "$name PASSED"
    else
      echo "$name FAILED (see $name.log)"
      TESTS=FAIL
    fi
  done | tee "$LOGS/test.log"
  grep -q FAILED "$LOGS/test.log" && TESTS=FAIL
fi
grep -E "^\[  (FAILED|PASSED) |KERNEL_TEST_SUMMARY" "$LOGS/kernel_test.log" 2>/dev/null
[ "$MODE" = bazel ] && grep -E "(PASSED|FAILED|TIMEOUT|NO STATUS) in" "$LOGS/test.log"

# --- 4. our benchmark ------------------------------------------------------------
note "kernel_bench (log: bench.log)"
timeout 90 "$KERNEL_BENCH" --workload="$WORKLOAD" --tokens="$TOKENS" --heads="$HEADS" \
  --head_dim="$HEAD_DIM" --reps="$REPS" --cu_seqlens_out="$LOGS/cu_seqlens.txt" \
  --dump_dir="$LOGS" >"$LOGS/bench.log" 2>&1 || note "kernel_bench failed (see bench.log)"
cat "$LOGS/bench.log"

# --- 5. torch -------------------------------------------------------------------
note "torch_flash_bench.py (log: torch.log)"
PYTHONUNBUFFERED=1 timeout 150 "$PYTHON" "$ROOT/tests/gpu/torch_flash_bench.py" \
  --cu_seqlens="$LOGS/cu_seqlens.txt" --heads="$HEADS" --head_dim="$HEAD_DIM" --reps="$REPS" \
  --dump_dir="$LOGS" >"$LOGS/torch.log" 2>&1 || note "torch_flash_bench failed (see torch.log)"
cat "$LOGS/torch.log"

# --- 6. the table -----------------------------------------------------------------
# field NAME LINE: the value of NAME=... in LINE.
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p" | head -1; }
ALL=PASS
{
  printf "%-11s %-5s %-4s %-6s %-11s %-11s %-10s %-6s %-7s %-30s %-6s\n" kernel dtype D T \
    "ours_TF/s" "ours_call" "torch_TF/s" ratio target "error/rounding ours|torch" result
  for dir in fwd bwd; do
    ours=$(grep "^BENCH kernel=$dir " "$LOGS/bench.log" 2>/dev/null | head -1)
    theirs=$(grep "^TORCH kernel=$dir " "$LOGS/torch.log" 2>/dev/null | head -1)
    ours_tf=$(field tflops_kernel "$ours")
    ours_call=$(field tflops_call "$ours")
    torch_tf=$(field tflops "$theirs")
    target=$([ $dir = fwd ] && echo 0.8 || echo 0.7)
    tensors=$([ $dir = fwd ] && echo "o" || echo "dq dk dv")
    err_ok=1
    errs=""
    for t in $tensors; do
      acc=$(grep "^ACCURACY tensor=$t " "$LOGS/torch.log" 2>/dev/null | head -1)
      o=$(field ours_over_rounding "$acc")
      th=$(field torch_over_rounding "$acc")
      rel=$(field ours_over_torch "$acc")
      errs="$errs$t:${o:-?}|${th:-?} "
      # Within 2x rounding, or within 2x of PyTorch's own error.
      if [ -z "$o" ] || ! awk -v o="$o" -v r="$rel" 'BEGIN{exit !(o <= 2 || r <= 2)}'; then
        err_ok=0
      fi
    done
    ratio="?"
    result=FAIL
    if [ -n "$ours_tf" ] && [ -n "$torch_tf" ]; then
      ratio=$(awk -v a="$ours_tf" -v b="$torch_tf" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}')
      if awk -v r="$ratio" -v t="$target" 'BEGIN{exit !(r >= t)}' && [ $err_ok = 1 ]; then
        result=PASS
      fi
    fi
    [ $result = PASS ] || ALL=FAIL
    printf "%-11s %-5s %-4s %-6s %-11s %-11s %-10s %-6s %-7s %-30s %-6s\n" "attn_$dir" bf16 \
      "$HEAD_DIM" "$TOKENS" "${ours_tf:-?}" "${ours_call:-?}" "${torch_tf:-?}" "$ratio" \
      ">=$target" "$errs" "$result"
  done
  echo "ours_TF/s: Forward/Backward alone (fp32 accumulators); ours_call: plus accumulator"
  echo "init, delta and casts to bf16 (what torch's op returns); ratio = ours_TF/s / torch_TF/s"
  printf "%-11s %s\n" "kernel_test" \
    "$TESTS (random slices, D 64/128/256, bf16/fp16: error <= 2x rounding; worst ratios above)"
  printf "%-11s %s\n" "all_tests" \
    "$TESTS ($MODE: //tests/gpu/... //kernels/cuda/... //server/gpu/..., gpu-tagged included)"
} | tee "$LOGS/table.txt"
[ "$TESTS" = PASS ] || ALL=FAIL
note "overall: $ALL (wall $(( $(date +%s) - START ))s)"
[ "$ALL" = PASS ] && finish 0 || finish 1

#!/usr/bin/env bash
# Runs one Python program (a unittest file, an example) under `bazel test`
# with Debian's /usr/bin/python3 (python3-torch, -grpcio, -numpy, -protobuf),
# the hsap package (sources + generated hsap/v1 modules) from the runfiles on
# PYTHONPATH and $HSAPD naming the runfile //server:hsapd. The working
# directory is the runfiles root.
# Usage (from BUILD): run_python_test.sh <runfile path of the program> [args]
set -euo pipefail
runfiles="${TEST_SRCDIR:?run this under bazel test}/hsap"
export PYTHONPATH="$runfiles/client/python${PYTHONPATH:+:$PYTHONPATH}"
export HSAPD="$runfiles/server/hsapd"
export PYTHONDONTWRITEBYTECODE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec /usr/bin/python3 "$runfiles/$1" "${@:2}"

#!/usr/bin/env bash
# Command one: set up and build, then show what HSAP is for. Starts a
# two-node cluster on loopback — two hsapd daemons with two CPU devices each,
# --peers on 127.0.0.1 with free ports, UCX over tcp between them — and runs
# a group of 4 ranks, each its own client process holding only its tokens,
# on packs of real documents (workloads/python-stdlib.tokens) for ring,
# ulysses, usp, sap, hsap and auto. Every forward and backward is checked
# against the float64 reference; one table shows, per strategy, the bytes
# received by the busiest rank, measured and modeled time and the worst
# error, and the last line says CHECK PASSED or CHECK FAILED. Everything it
# started is stopped on exit, on failure and on ctrl-C.
# Extra arguments go to hsap_demo (e.g. --tokens=8192 --packs=3).
# HSAP_DEMO_BIN=<dir> runs <dir>/server/hsapd and <dir>/client/demo/hsap_demo
# instead of building (another commit's binaries, for a before/after run:
# scripts/demo_before_after.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${HSAP_DEMO_BIN:-}
PEER_FLAGS=(--insecure_peers)
if [ -z "$BIN" ]; then
  bash scripts/install_deps.sh
  bazel build //server:hsapd //client/demo:hsap_demo
  BIN=bazel-bin
else
  HELP=$("$BIN/server/hsapd" --helpfull 2>&1 || true)
  # Binaries from before the flag: their peers were open.
  [[ $HELP == *-insecure_peers* ]] || PEER_FLAGS=()
fi

NODES=2
DEVICES=2
WORK=$(mktemp -d /tmp/hsap-demo.XXXXXX)
DAEMONS=()
DEMO=
cleanup() {
  set +e  # stop everything, whatever fails
  local pid
  # The rank processes die with hsap_demo (PR_SET_PDEATHSIG).
  if [ -n "$DEMO" ]; then
    kill -TERM "$DEMO" 2>/dev/null
    wait "$DEMO" 2>/dev/null
  fi
  # SIGTERM drains (calls in flight may finish for --drain_timeout_s).
  for pid in "${DAEMONS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${DAEMONS[@]}"; do wait "$pid" 2>/dev/null; done
  DAEMONS=()
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT TERM

# Free TCP ports on 127.0.0.1 for the peers (bound together, so distinct).
read -r -a PORTS < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range('"$NODES"')]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
PEERS=$(printf '127.0.0.1:%s,' "${PORTS[@]}")
PEERS=${PEERS%,}
SOCKETS=()
for ((n = 0; n < NODES; n++)); do
  SOCKETS+=("$WORK/node$n.sock")
  "$BIN/server/hsapd" --socket="$WORK/node$n.sock" --devices=cpu:$DEVICES \
    --port="${PORTS[$n]}" --peers="$PEERS" --node_rank=$n --ucx_transports=tcp "${PEER_FLAGS[@]}" \
    --cpu_threads=1 --drain_timeout_s=3 >"$WORK/node$n.log" 2>&1 &
  DAEMONS+=($!)
  echo "demo: node $n: hsapd --devices=cpu:$DEVICES --port=${PORTS[$n]} --peers=$PEERS --node_rank=$n (pid $!)"
done
for ((n = 0; n < NODES; n++)); do
  for _ in $(seq 1 400); do
    [ -S "${SOCKETS[$n]}.session" ] && [ -S "${SOCKETS[$n]}" ] && break
    kill -0 "${DAEMONS[$n]}" 2>/dev/null || { cat "$WORK/node$n.log"; echo "demo: hsapd $n exited" >&2; exit 1; }
    sleep 0.05
  done
done

status=0
start=$SECONDS
# In the background and waited for, so that a signal to this script runs
# the cleanup at once.
"$BIN/client/demo/hsap_demo" --sockets="$(IFS=,; echo "${SOCKETS[*]}")" \
  --devices_per_node=$DEVICES --results_dir="$WORK" "$@" &
DEMO=$!
wait "$DEMO" || status=$?
DEMO=
echo "demo: hsap_demo took $((SECONDS - start)) s"
if [ $status -ne 0 ]; then
  for ((n = 0; n < NODES; n++)); do
    echo "--- hsapd node $n log (last 40 lines)"
    tail -n 40 "$WORK/node$n.log"
  done
fi
exit $status

#!/usr/bin/env bash
# Command one: set up, build, start hsapd on its embedded default (single
# node, CPU devices, socket /run/hsap/hsapd.sock), run the demo against it
# (real document lengths, forward + backward checked against the float64
# reference), print the report, and stop the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh
bazel build //server:hsapd //client/demo:hsap_demo

SOCKET=/run/hsap/hsapd.sock
LOG=$(mktemp /tmp/hsapd-demo.XXXXXX.log)
bazel-bin/server/hsapd >"$LOG" 2>&1 &
DAEMON=$!
cleanup() {
  if kill -0 "$DAEMON" 2>/dev/null; then
    kill -TERM "$DAEMON"
    wait "$DAEMON" || true
  fi
}
trap cleanup EXIT

for _ in $(seq 1 200); do
  [ -S "$SOCKET.session" ] && [ -S "$SOCKET" ] && break
  kill -0 "$DAEMON" 2>/dev/null || { cat "$LOG"; echo "hsapd exited" >&2; exit 1; }
  sleep 0.05
done

status=0
bazel-bin/client/demo/hsap_demo --socket="$SOCKET" "$@" || status=$?
cleanup
trap - EXIT
echo "--- hsapd log ($LOG)"
cat "$LOG"
exit $status

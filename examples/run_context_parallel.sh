#!/usr/bin/env bash
# Runs examples/train_context_parallel.py as a 2-node job on this machine:
# two hsapd (one per "node", each with its Unix socket and a TCP port on
# 127.0.0.1, 2 CPU device slots) and two torchrun invocations (--nnodes=2,
# --node_rank=0 and 1, --nproc_per_node=2, gloo over loopback), each
# node's processes talking to their node's daemon ($HSAP_SOCKET).
#
#   examples/run_context_parallel.sh [train_context_parallel.py args, e.g. --steps=4]
#
# Ports are free ones found at start. Everything is bounded in time
# ($HSAP_EXAMPLE_TIMEOUT_S, default 150 s for the torchruns, 30 s for the
# daemons to start) and everything started here (each in its own process
# group) is killed on exit, whatever the outcome. The last line is CHECK
# PASSED (exit 0) or CHECK FAILED (exit 1). Binaries: $HSAPD (default: the
# Bazel runfile under `bazel test`, else bazel-bin/server/hsapd), $PYTHON
# (default /usr/bin/python3, which has torch).
set -uo pipefail

if [[ -n "${TEST_SRCDIR:-}" ]]; then  # under bazel test: the runfiles tree
  root="$TEST_SRCDIR/hsap"
  export PYTHONPATH="$root/client/python${PYTHONPATH:+:$PYTHONPATH}"
  hsapd="${HSAPD:-$root/server/hsapd}"
else
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  export PYTHONPATH="$root/client/python:$root/bazel-bin/client/python${PYTHONPATH:+:$PYTHONPATH}"
  hsapd="${HSAPD:-$root/bazel-bin/server/hsapd}"
fi
python="${PYTHON:-/usr/bin/python3}"
limit_s="${HSAP_EXAMPLE_TIMEOUT_S:-150}"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1

fail() {
  echo "$*" >&2
  echo "CHECK FAILED"
  exit 1
}
[[ -f "$hsapd" && -x "$hsapd" ]] || fail "no hsapd binary (build //server:hsapd or set \$HSAPD)"

work="$(mktemp -d /tmp/hsap-cp-XXXXXX)"
groups=()  # process group ids of everything started here
cleanup() {
  for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for g in "${groups[@]}"; do kill -0 -- "-$g" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for g in "${groups[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Three distinct free loopback ports: the daemons' and torchrun's master.
read -r port0 port1 master_port < <("$python" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')

# Starts `setsid "$@"` in the background with its output in $log; its pid is
# its process group id.
spawn() {
  local log="$1"
  shift
  setsid "$@" >"$log" 2>&1 </dev/null &
  groups+=("$!")
}

# ---------------------------------------------------------------------------
# THE DAEMONS: the one place that starts hsapd. No static cluster: each
# daemon only serves TCP; the group forms at run time when the processes'
# first call names both daemons (hsap.init_from_env gathers their addresses,
# which each process asks its own daemon for: GetClusterStatus.self_address).
start_daemon() {  # start_daemon <node rank> <tcp port>
  mkdir -p "$work/node$1"
  spawn "$work/hsapd$1.log" "$hsapd" --socket="$work/node$1/hsapd.sock" --devices=cpu:2 \
    --host=127.0.0.1 --port="$2" --cpu_threads=1 --ucx_transports=tcp --heartbeat_ms=100 \
    --insecure_peers
}
start_daemon 0 "$port0"
start_daemon 1 "$port1"
# ---------------------------------------------------------------------------

daemon_logs() {
  for i in 0 1; do
    echo "--- hsapd node $i (last lines)"
    tail -n 20 "$work/hsapd$i.log"
  done
}

# Both daemons serve, and see each other (cluster formed), within 30 s.
if ! "$python" - "$work/node0/hsapd.sock" "$work/node1/hsapd.sock" <<'EOF'
import sys, time
import hsap
deadline = time.monotonic() + 30
for sock in sys.argv[1:]:
    while True:
        try:
            with hsap.connect(sock) as c:
                if c.cluster_status().formed:
                    break
        except hsap.HsapError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"hsapd at {sock} is not serving a formed cluster after 30 s")
        time.sleep(0.05)
EOF
then
  daemon_logs >&2
  fail "the daemons did not start"
fi

echo "hsapd: 127.0.0.1:$port0 (node 0), 127.0.0.1:$port1 (node 1); torchrun master 127.0.0.1:$master_port"
# --redirects=2 --tee=2 (workers' stderr through a file, also to the log;
# stdout straight to it): Debian's torch 1.13 on Python 3.11 cannot parse
# torchrun's default "0" (Std.NONE is not among Std's members there, so
# start_processes fails with "'NoneType' object has no attribute 'get'").
torchruns=()
for i in 0 1; do
  spawn "$work/torchrun$i.log" env HSAP_SOCKET="$work/node$i/hsapd.sock" \
    timeout -k 5 "$limit_s" "$python" -m torch.distributed.run --nnodes=2 --node_rank="$i" \
    --nproc_per_node=2 --master_addr=127.0.0.1 --master_port="$master_port" \
    --redirects=2 --tee=2 --log_dir="$work/torchrun$i" \
    "$root/examples/train_context_parallel.py" "$@"
  torchruns+=("$!")
done
# The first torchrun to fail ends the other (it would wait for its peer
# until the time limit).
status=0
running=("${torchruns[@]}")
while ((${#running[@]} > 0)); do
  wait -n -p finished "${running[@]}"
  rc=$?
  left=()
  for pid in "${running[@]}"; do [[ "$pid" == "$finished" ]] || left+=("$pid"); done
  running=("${left[@]}")
  if ((rc != 0)); then
    status=$rc
    for pid in "${running[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    wait "${running[@]}"
    break
  fi
done

echo "--- node 0 (torchrun --node_rank=0; pg rank 0 prints the table)"
grep -v "^CHECK " "$work/torchrun0.log"
if ((status != 0)) || [[ "$(tail -n 1 "$work/torchrun0.log")" != "CHECK PASSED" ]]; then
  echo "--- node 1 (torchrun --node_rank=1)"
  cat "$work/torchrun1.log"
  daemon_logs
  ((status == 124)) && echo "the torchruns did not finish within ${limit_s} s"
  echo "CHECK FAILED"
  exit 1
fi
echo "CHECK PASSED"

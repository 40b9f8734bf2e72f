#!/usr/bin/env bash
# The emulated multi-node cluster, one command (bench/emulated_cluster/README.md):
#
#   bash bench/emulated_cluster/run.sh --nodes=8 --slots=2 --tokens=262144
#
# As root: N network namespaces ("nodes") joined by veth links to a bridge
# that lives in a namespace of its own, every link shaped with tc (htb,
# fair per peer node, or tbf) in both directions; one hsapd per node
# namespace (D CPU device slots, gRPC and UCX over TCP on the node's
# address); the bench's clients in the root namespace, over the daemons'
# Unix sockets. Steps:
#   1. namespaces, bridge, links (unshaped), daemons; wait for the cluster;
#   2. calibrate: sap and hsap on the bench's first pack, links unshaped
#      -> the effective FLOP/s of one rank with every rank of the machine
#      busy (the plans' work over the measured time); the pace (--pace
#      times that) is the rate every rank's kernels are then held to;
#   3. link rate = that FLOP/s over the target profile's FLOP per
#      inter-node byte, times D per node link; shaped on both ends;
#   4. probe the shaped link (goodput, round trip) -> the emulation's cost
#      profile (custom:...), daemons restarted with it and the pace;
#   5. measure every strategy side by side (emu_bench --phase=measure).
# Everything it creates (namespaces with their links, daemons, its temp
# folder) is removed on exit, on failure and on ctrl-C. Addresses
# 10.213.0.0/24 exist only inside the namespaces it creates.
set -euo pipefail
cd "$(dirname "$0")/../.."

NODES=4 SLOTS=2 TOKENS=262144 PACKS=2 REPS=3 HEADS=8 KV_HEADS=2 HEAD_DIM=32
PROFILE=h100 STRATEGIES=ring,allgather,ulysses,usp,sap,hsap,auto
TIME_LIMIT_S=3600 CPU_THREADS=1 INTRA_BYTES_PER_S=2e9 INTRA_LATENCY_US=20
QUEUE_MS=50 HEADER_OVERHEAD= BUILD=1 CALIBRATE_REPS=3 FLOPS_PER_RANK= SHAPING=fair PACE=0.8 SLOW_START_AFTER_IDLE=0 OFFLOAD=0
usage() {
  cat <<EOF
usage: bash bench/emulated_cluster/run.sh [--key=value ...]   (as root)
  --nodes=$NODES --slots=$SLOTS          nodes (namespaces) and CPU device slots per node
  --tokens=$TOKENS --packs=$PACKS --reps=$REPS   pack size T, packs, repetitions (median)
  --heads=$HEADS --kv_heads=$KV_HEADS --head_dim=$HEAD_DIM  attention shape (fp32)
  --profile=$PROFILE                   target ratio: its FLOP/s over its inter-node bytes/s
  --strategies=$STRATEGIES
  --time_limit_s=$TIME_LIMIT_S         no new run starts after this (the bench's own bound)
  --cpu_threads=$CPU_THREADS             hsapd --cpu_threads of every daemon
  --intra_bytes_per_s=$INTRA_BYTES_PER_S --intra_latency_us=$INTRA_LATENCY_US  model's intra-node tier (not calibrated)
  --queue_ms=$QUEUE_MS                  queue of every link end, in ms at the link rate
  --shaping=$SHAPING                  fair: htb, one queue per peer node and one for small
                                     packets (ACKs, handshakes) ahead of data; tbf: one FIFO
  --flops_per_rank=X                 skip the calibration and use X
  --offload=$OFFLOAD                      1: the veths hand the qdiscs 64 KiB segmentation-offload
                                     packets; 0: one MTU segment each (gso_max_segs 1)
  --slow_start_after_idle=$SLOW_START_AFTER_IDLE          the nodes' net.ipv4.tcp_slow_start_after_idle (1: Linux's default)
  --pace=$PACE                        hold every rank's kernels to this share of the calibrated
                                     rate (hsapd --emulate_flops_per_s), so that ranks sharing
                                     the cores compute as separate devices; 0: not held
  --calibrate_reps=$CALIBRATE_REPS              calibration runs per strategy (sap, hsap; median)
  --no_build                         use the binaries already in bazel-bin
EOF
}
for arg in "$@"; do
  case "$arg" in
    --nodes=*) NODES=${arg#*=} ;;
    --slots=*) SLOTS=${arg#*=} ;;
    --tokens=*) TOKENS=${arg#*=} ;;
    --packs=*) PACKS=${arg#*=} ;;
    --reps=*) REPS=${arg#*=} ;;
    --heads=*) HEADS=${arg#*=} ;;
    --kv_heads=*) KV_HEADS=${arg#*=} ;;
    --head_dim=*) HEAD_DIM=${arg#*=} ;;
    --profile=*) PROFILE=${arg#*=} ;;
    --strategies=*) STRATEGIES=${arg#*=} ;;
    --time_limit_s=*) TIME_LIMIT_S=${arg#*=} ;;
    --cpu_threads=*) CPU_THREADS=${arg#*=} ;;
    --intra_bytes_per_s=*) INTRA_BYTES_PER_S=${arg#*=} ;;
    --intra_latency_us=*) INTRA_LATENCY_US=${arg#*=} ;;
    --queue_ms=*) QUEUE_MS=${arg#*=} ;;
    --shaping=*) SHAPING=${arg#*=} ;;
    --pace=*) PACE=${arg#*=} ;;
    --offload=*) OFFLOAD=${arg#*=} ;;
    --slow_start_after_idle=*) SLOW_START_AFTER_IDLE=${arg#*=} ;;
    --flops_per_rank=*) FLOPS_PER_RANK=${arg#*=} ;;
    --calibrate_reps=*) CALIBRATE_REPS=${arg#*=} ;;
    --no_build) BUILD=0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $arg" >&2; usage >&2; exit 2 ;;
  esac
done
for v in NODES SLOTS TOKENS PACKS REPS HEADS KV_HEADS HEAD_DIM TIME_LIMIT_S CPU_THREADS QUEUE_MS CALIBRATE_REPS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --${v,,}=${!v} is not a positive integer" >&2; exit 2; }
done
[[ "$PACE" =~ ^(0|0?\.[0-9]+|1|1\.0*)$ ]] || { echo "run.sh: --pace=$PACE must be in [0, 1]" >&2; exit 2; }
[[ "$OFFLOAD" =~ ^[01]$ ]] || { echo "run.sh: --offload must be 0 or 1" >&2; exit 2; }
# The payload share of what the qdisc counts: 0.99 measured by the probe
# with 64 KiB offload packets; 1448 of 1500 bytes per MTU segment without.
[ -n "$HEADER_OVERHEAD" ] || HEADER_OVERHEAD=$([ "$OFFLOAD" = 1 ] && echo 0.99 || echo 0.965)
[[ "$SLOW_START_AFTER_IDLE" =~ ^[01]$ ]] || { echo "run.sh: --slow_start_after_idle must be 0 or 1" >&2; exit 2; }
[[ "$SHAPING" =~ ^(fair|tbf)$ ]] || { echo "run.sh: --shaping=$SHAPING must be fair or tbf" >&2; exit 2; }
(( NODES >= 2 && NODES <= 200 )) || { echo "run.sh: --nodes=$NODES must be in [2, 200]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (network namespaces, tc)" >&2; exit 1; }
for tool in ip tc /usr/bin/python3; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing" >&2; exit 1; }
done

if [ "$BUILD" = 1 ]; then
  flock -o /tmp/hsap-bazel.lock bazel build //server:hsapd //bench/emulated_cluster:emu_bench
fi
HSAPD=bazel-bin/server/hsapd
BENCH=bazel-bin/bench/emulated_cluster/emu_bench
for b in "$HSAPD" "$BENCH"; do [ -x "$b" ] || { echo "run.sh: $b is not built" >&2; exit 1; }; done

# ---- everything below is undone by cleanup -------------------------------
TAG="hsapemu$$"
SW="$TAG-sw"
WORK=$(mktemp -d /tmp/hsap-emu.XXXXXX)
declare -a NAMESPACES=() DAEMONS=() HELPERS=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${HELPERS[@]}" "${DAEMONS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${HELPERS[@]}" "${DAEMONS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ "$status" != 0 ] && ls "$WORK"/node*.log >/dev/null 2>&1; then
    echo "run.sh: failed ($status); last lines of the daemons' logs:" >&2
    for f in "$WORK"/node*.log; do echo "== $f" >&2; tail -n 5 "$f" >&2; done
  fi
  rm -rf "$WORK"
  echo "run.sh: removed namespaces ${NAMESPACES[*]:-none}, daemons and $WORK" >&2
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addr() { echo "10.213.0.$(( $1 + 1 ))"; }
ip netns add "$SW"; NAMESPACES+=("$SW")
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for ((i = 0; i < NODES; i++)); do
  ns="$TAG-n$i"
  ip netns add "$ns"; NAMESPACES+=("$ns")
  ip link add "p$i" netns "$SW" type veth peer name eth0 netns "$ns"
  ip -n "$SW" link set "p$i" master br0
  ip -n "$SW" link set "p$i" up
  ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # A stage's flows start after the compute between them: no return to
  # slow start after idle (RDMA links do not ramp up again). Per namespace.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle="$SLOW_START_AFTER_IDLE"
done
echo "emulated cluster: $NODES node namespaces ($TAG-n*) on bridge br0 in $SW, $SLOTS slots each"

PEERS=$(for ((i = 0; i < NODES; i++)); do printf '%s:7001,' "$(addr "$i")"; done)
PEERS=${PEERS%,}
SOCKETS=$(for ((i = 0; i < NODES; i++)); do printf '%s/node%d.sock,' "$WORK" "$i"; done)
SOCKETS=${SOCKETS%,}
PROFILE_FLAG_SUPPORTED=0
# --helpfull exits 1 (abseil), which pipefail would pass on: check the text alone.
HSAPD_HELP=$("$HSAPD" --helpfull 2>&1 || true)
if grep -qE -- '-profile[ =(]' <<<"$HSAPD_HELP"; then PROFILE_FLAG_SUPPORTED=1; fi

start_daemons() {  # "$@": extra flags
  DAEMONS=()
  for ((i = 0; i < NODES; i++)); do
    # UCX only on the node's link (not lo, whose 127.0.0.1 is every
    # namespace's own); tcp between nodes, self for a node's own slots;
    # over tcp hsapd sends every message eager (--ucx_rndv_thresh).
    ip netns exec "$TAG-n$i" env UCX_NET_DEVICES=eth0 "$HSAPD" --socket="$WORK/node$i.sock" \
      --devices=cpu:"$SLOTS" --cpu_threads="$CPU_THREADS" --host="$(addr "$i")" --port=7001 \
      --peers="$PEERS" --node_rank="$i" --ucx_transports=tcp,self --insecure_peers \
      --heartbeat_ms=1000 --peer_down_ms=60000 --call_deadline_ms=1200000 "$@" \
      >>"$WORK/node$i.log" 2>&1 &
    DAEMONS+=("$!")
  done
  "$BENCH" --phase=wait --sockets="$SOCKETS" --wait_s=120
}
stop_daemons() {
  for pid in "${DAEMONS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${DAEMONS[@]}"; do wait "$pid" 2>/dev/null || true; done
  DAEMONS=()
}
start_daemons

COMMON=(--sockets="$SOCKETS" --devices="$SLOTS" --tokens="$TOKENS" --heads="$HEADS"
        --kv_heads="$KV_HEADS" --head_dim="$HEAD_DIM")
if [ -z "$FLOPS_PER_RANK" ]; then
  echo "== calibration (links unshaped)"
  timeout 1800 "$BENCH" --phase=calibrate "${COMMON[@]}" --calibrate_reps="$CALIBRATE_REPS" \
    | tee "$WORK/calibrate.txt"
  FLOPS_PER_RANK=$(sed -n 's/^flops_per_rank=//p' "$WORK/calibrate.txt")
else
  echo "== calibration skipped: --flops_per_rank=$FLOPS_PER_RANK"
fi

PACE_FLAGS=()
if [ "$PACE" != 0 ]; then
  CALIBRATED=$FLOPS_PER_RANK
  FLOPS_PER_RANK=$(/usr/bin/python3 -c "print('%.4g' % ($CALIBRATED * $PACE))")
  PACE_FLAGS=(--emulate_flops_per_s="$FLOPS_PER_RANK")
  echo "pace: every rank's kernels held to $PACE x $CALIBRATED = $FLOPS_PER_RANK FLOP/s (hsapd ${PACE_FLAGS[0]})"
fi

echo "== link rate"
"$BENCH" --phase=link_rate --flops_per_rank="$FLOPS_PER_RANK" --target_profile="$PROFILE" \
  | tee "$WORK/rate.txt"
RANK_BPS=$(sed -n 's/^inter_bytes_per_s=//p' "$WORK/rate.txt")
# One link per node carries its D ranks' traffic; tbf counts IP packets,
# so the rate covers the TCP/IP headers too (HEADER_OVERHEAD: the payload
# share, set above).
NODE_BITS=$(/usr/bin/python3 -c "print(int(round($RANK_BPS * $SLOTS * 8 / $HEADER_OVERHEAD)))")
BURST=$(/usr/bin/python3 -c "print(max(65536, int($NODE_BITS / 8 * 0.01)))")
echo "per rank $RANK_BPS B/s x $SLOTS slots / $HEADER_OVERHEAD payload share -> $SHAPING rate $NODE_BITS bit/s per node link, each direction (burst $BURST B, queue ${QUEUE_MS} ms)"
QUEUE_BYTES=$(/usr/bin/python3 -c "print(max(2 * $BURST, int($NODE_BITS / 8 * $QUEUE_MS / 1000)))")
# fair: an InfiniBand-like link neither drops under incast nor holds a
# flow's handshake behind another's bulk data. htb at the link rate with a
# class per peer node (its guaranteed share rate/N, borrowing up to the
# link) and a first-priority class for packets under 128 bytes (TCP ACKs,
# UCX's rendezvous handshakes); each class its own byte FIFO. $1: the
# namespace, $2: the device, $3: "dst" (node side) or "src" (switch side),
# $4: the node the link belongs to.
shape_fair() {
  local ns=$1 dev=$2 dir=$3 self=$4 share
  share=$(( NODE_BITS / NODES ))
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 2
  ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:1 htb rate "${NODE_BITS}bit" burst "$BURST" cburst "$BURST"
  ip netns exec "$ns" tc class add dev "$dev" parent 1:1 classid 1:2 htb rate "${share}bit" ceil "${NODE_BITS}bit" \
    burst "$BURST" cburst "$BURST" prio 0
  ip netns exec "$ns" tc qdisc add dev "$dev" parent 1:2 bfifo limit "$QUEUE_BYTES"
  ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 match u16 0 0xff80 at 2 flowid 1:2
  for ((j = 0; j < NODES; j++)); do
    (( j == self )) && continue
    ip netns exec "$ns" tc class add dev "$dev" parent 1:1 classid "1:$((100 + j))" htb rate "${share}bit" \
      ceil "${NODE_BITS}bit" burst "$BURST" cburst "$BURST" prio 1
    ip netns exec "$ns" tc qdisc add dev "$dev" parent "1:$((100 + j))" bfifo limit "$QUEUE_BYTES"
    ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 2 u32 match ip "$dir" "$(addr "$j")/32" \
      flowid "1:$((100 + j))"
  done
}
for ((i = 0; i < NODES; i++)); do
  # Without offload a link's qdiscs see MTU segments: a drop loses one, not
  # 44, and the small-packet class is not stuck behind a 64 KiB packet
  # (50 ms of a 10 Mbit/s link). Set with the shaping, so the calibration
  # (links unshaped) is not slowed by it.
  if [ "$OFFLOAD" = 0 ]; then
    ip -n "$SW" link set "p$i" gso_max_segs 1
    ip -n "$TAG-n$i" link set eth0 gso_max_segs 1
  fi
  if [ "$SHAPING" = fair ]; then
    shape_fair "$TAG-n$i" eth0 dst "$i"
    shape_fair "$SW" "p$i" src "$i"
  else
    ip netns exec "$TAG-n$i" tc qdisc add dev eth0 root tbf rate "${NODE_BITS}bit" burst "$BURST" latency "${QUEUE_MS}ms"
    ip netns exec "$SW" tc qdisc add dev "p$i" root tbf rate "${NODE_BITS}bit" burst "$BURST" latency "${QUEUE_MS}ms"
  fi
done

echo "== probe (node 1 -> node 0, one TCP flow, ~3 s)"
PROBE_BYTES=$(/usr/bin/python3 -c "print(int($NODE_BITS / 8 * 3))")
ip netns exec "$TAG-n0" /usr/bin/python3 bench/emulated_cluster/probe_link.py serve "$(addr 0)" 7999 &
HELPERS+=("$!")
timeout 120 ip netns exec "$TAG-n1" /usr/bin/python3 bench/emulated_cluster/probe_link.py probe \
  "$(addr 0)" 7999 "$PROBE_BYTES" | tee "$WORK/probe.txt"
wait "${HELPERS[0]}" || true
HELPERS=()
GOODPUT=$(sed -n 's/.*goodput_bytes_per_s=\([^ ]*\).*/\1/p' "$WORK/probe.txt")
RTT_US=$(sed -n 's/.*rtt_us=\([^ ]*\).*/\1/p' "$WORK/probe.txt")
read -r INTER_BPS INTER_LAT_US RATIO <<<"$(/usr/bin/python3 -c "
g, s, f, rtt = $GOODPUT, $SLOTS, $FLOPS_PER_RANK, $RTT_US
print('%.6g %.6g %.1f' % (g / s, rtt / 2, f / (g / s)))")"
MODEL_PROFILE="custom:flops=$FLOPS_PER_RANK,inter_bytes_per_s=$INTER_BPS,intra_bytes_per_s=$INTRA_BYTES_PER_S,inter_latency_us=$INTER_LAT_US,intra_latency_us=$INTRA_LATENCY_US"
# A node's D slots share its one link (D times a rank's rate; any slot may
# use all of it): the model's inter_link_ranks (plan/cost_model.h).
if [ "$SLOTS" -gt 1 ]; then MODEL_PROFILE="$MODEL_PROFILE,inter_link_ranks=$SLOTS"; fi
echo "measured: node link goodput $GOODPUT B/s -> $INTER_BPS B/s per rank; one-way latency $INTER_LAT_US us (half the idle round trip)"
echo "emulated ratio: $FLOPS_PER_RANK FLOP/s / $INTER_BPS B/s = $RATIO FLOP per inter-node byte (target $PROFILE: see above)"
echo "model profile: $MODEL_PROFILE"

AUTO_BY=bench
if [ "$PROFILE_FLAG_SUPPORTED" = 1 ]; then
  echo "== restarting the daemons with --profile=<the model profile>"
  stop_daemons
  start_daemons "--profile=$MODEL_PROFILE" "${PACE_FLAGS[@]}"
  AUTO_BY=daemon
else
  echo "note: this hsapd has no --profile flag; auto is resolved by the bench under the model profile"
fi

echo "== measure"
timeout $(( TIME_LIMIT_S + 1800 )) "$BENCH" --phase=measure "${COMMON[@]}" --packs="$PACKS" \
  --reps="$REPS" --strategies="$STRATEGIES" --profile="$MODEL_PROFILE" --auto_by="$AUTO_BY" \
  --time_limit_s="$TIME_LIMIT_S"

# TCP's own account of the links (each namespace's counters start at zero):
# retransmitted segments and retransmission timeouts, summed over nodes.
RETRANS=0 TIMEOUTS=0 SEGS=0
for ((i = 0; i < NODES; i++)); do
  read -r r t s <<<"$(ip netns exec "$TAG-n$i" nstat -az TcpRetransSegs TcpExtTCPTimeouts TcpOutSegs 2>/dev/null |
    awk '$1=="TcpRetransSegs"{r=$2} $1=="TcpExtTCPTimeouts"{t=$2} $1=="TcpOutSegs"{s=$2} END{print r+0, t+0, s+0}')"
  RETRANS=$((RETRANS + r)) TIMEOUTS=$((TIMEOUTS + t)) SEGS=$((SEGS + s))
done
echo "tcp over all nodes: $SEGS segments sent, $RETRANS retransmitted, $TIMEOUTS retransmission timeouts"

#!/usr/bin/env bash
# Mutual TLS between daemons (docs/reliability.md, "Trust between daemons"),
# against real hsapd processes on loopback, certificates from
# deploy/tls/make_certs.sh:
#  1. two daemons over mutual TLS (static peers, a token for operators):
#     the demo's group of 4 ranks runs every strategy forward + backward
#     and matches the float64 reference (CHECK PASSED);
#     a caller without a client certificate is refused at the headers
#     (an 8 MiB peer call UNAUTHENTICATED, not RESOURCE_EXHAUSTED), health
#     stays open to it, and a certificate's 1 MiB probe is served;
#  2. the token never crosses the wire in clear: a stand-in peer
#     (peer_wire_listener.py) records what a daemon sends it. With a token
#     and no TLS its Peer calls carry `authorization: Bearer <token>` in
#     plain HTTP/2 (so the check can fail); with TLS the wire holds only TLS
#     records, and the decrypted Peer calls carry no token (and a daemon
#     whose static peer never answers stops at once);
#  3. a daemon whose certificate another CA signed never forms a cluster
#     with the first: both sides' handshakes fail ("certificate verify
#     failed") and neither logs the other UP;
#  4. a certificate that does not name the host of the daemon's advertised
#     address: hsapd refuses to start, naming the certificate and the host.
set -uo pipefail

root="${TEST_SRCDIR:-.}/hsap"
[ -d "$root/server" ] || root=.
hsapd="$root/server/hsapd"
demo="$root/client/demo/hsap_demo"
listener="$root/tests/integration/peer_wire_listener.py"
make_certs="$root/deploy/tls/make_certs.sh"
# /tmp, not TEST_TMPDIR: Unix socket paths must stay under 108 bytes.
work=$(mktemp -d /tmp/peer_tls.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
section() { echo "--- [${SECONDS}s] $*"; }

ports() {  # N free TCP ports on 127.0.0.1
  /usr/bin/python3 -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}
wait_socket() {  # wait_socket SOCKET PID LOG
  for _ in $(seq 1 200); do
    [ -S "$1.session" ] && return 0
    kill -0 "$2" 2>/dev/null || { cat "$3"; return 1; }
    sleep 0.05
  done
  return 1
}

bash "$make_certs" "$work/ca1" a=IP:127.0.0.1 b=IP:127.0.0.1 elsewhere=IP:127.0.0.2 >/dev/null
HSAP_CA_NAME=another-ca bash "$make_certs" "$work/ca2" b=IP:127.0.0.1 >/dev/null
printf 'tls-test-token-0123456789abcdef\n' >"$work/token"
chmod 0600 "$work/token"
tls() {  # tls CA_DIR NAME: the three flags
  echo "--tls_cert=$work/$1/$2.pem --tls_key=$work/$1/$2.key --tls_ca=$work/$1/ca.pem"
}
common=(--devices=cpu:2 --cpu_threads=1 --ucx_transports=tcp --heartbeat_ms=200
        --drain_timeout_s=1 --token_file="$work/token")

# 1. A two-node cluster over mutual TLS computes correctly.
section "a group over mutual TLS"
read -r p0 p1 < <(ports 2)
peers="127.0.0.1:$p0,127.0.0.1:$p1"
for n in 0 1; do
  port=$([ $n = 0 ] && echo "$p0" || echo "$p1")
  name=$([ $n = 0 ] && echo a || echo b)
  # shellcheck disable=SC2046
  "$hsapd" --socket="$work/n$n.sock" --port="$port" --peers="$peers" --node_rank=$n \
    "${common[@]}" $(tls ca1 $name) >"$work/n$n.log" 2>&1 &
  pids+=($!)
  wait_socket "$work/n$n.sock" $! "$work/n$n.log" || fail "hsapd $n did not start"
done
start=$SECONDS
if timeout 240 "$demo" --sockets="$work/n0.sock,$work/n1.sock" --devices_per_node=2 \
    --tokens=1024 --packs=1 --results_dir="$work" >"$work/demo.out" 2>&1 &&
    grep -q "CHECK PASSED" "$work/demo.out"; then
  ok "demo over mutual TLS ($((SECONDS - start)) s): $(grep CHECK "$work/demo.out")"
else
  fail "demo over mutual TLS"; tail -20 "$work/demo.out"; tail -20 "$work/n0.log"
fi
# A caller without a client certificate: its peer call is refused at the
# headers (server/grpc/tcp_gate.h), so an 8 MiB body, twice the listener's
# message limit, comes back UNAUTHENTICATED, not RESOURCE_EXHAUSTED; health
# stays open; with daemon a's certificate a 1 MiB probe is served.
if /usr/bin/python3 - "$work" "$p0" <<'EOF'
import sys
import grpc
work, port = sys.argv[1], sys.argv[2]
ca = open(f"{work}/ca1/ca.pem", "rb").read()
def probe(creds, size):
    # ProbeLinkRequest.payload: field 1, bytes (tag 0x0a, varint length).
    n, varint = size, bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        varint.append(b | (0x80 if n else 0))
        if not n:
            break
    body = b"\x0a" + bytes(varint) + b"p" * size
    with grpc.secure_channel(f"127.0.0.1:{port}", creds,
                             options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        try:
            ch.unary_unary("/hsap.v1.Peer/ProbeLink")(body, timeout=10)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()
bad = 0
no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
code, details = probe(no_cert, 8 << 20)
if (code == grpc.StatusCode.UNAUTHENTICATED and
        details.startswith("the peer call presented no client certificate")):
    print(f"ok: no client certificate, 8 MiB probe: {code.name} at the headers ({details[:60]}...)")
else:
    print(f"FAIL: no client certificate, 8 MiB probe: {code} {details}")
    bad = 1
try:
    with grpc.secure_channel(f"127.0.0.1:{port}", no_cert) as ch:
        ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
    print("ok: no client certificate: health answers")
except grpc.RpcError as e:
    print(f"FAIL: no client certificate: health {e.code()} {e.details()}")
    bad = 1
with_cert = grpc.ssl_channel_credentials(
    root_certificates=ca, private_key=open(f"{work}/ca1/a.key", "rb").read(),
    certificate_chain=open(f"{work}/ca1/a.pem", "rb").read())
code, details = probe(with_cert, 1 << 20)
if code == grpc.StatusCode.OK:
    print("ok: with daemon a's certificate a 1 MiB probe is served")
else:
    print(f"FAIL: with daemon a's certificate: {code} {details}")
    bad = 1
sys.exit(bad)
EOF
then :; else fail "TLS gate"; fi
grep -q "(mutual TLS, token for operators)" "$work/n0.log" &&
  ok "start-up line: $(grep -o 'tcp 127.0.0.1:[0-9]* (mutual TLS[^)]*)' "$work/n0.log")" ||
  fail "the start-up line does not say mutual TLS"
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p"; done
pids=()

# 2. What crosses the wire: a stand-in peer at node 1's address.
section "the wire"
wire() {  # wire MODE: writes $work/wire.MODE.json
  local mode=$1 q0 q1 listener_pid daemon_pid extra=() largs=()
  read -r q0 q1 < <(ports 2)
  if [ "$mode" = tls ]; then
    largs=(--tls "$work/ca1/b.pem" "$work/ca1/b.key")
    # shellcheck disable=SC2207
    extra=($(tls ca1 a))
  fi
  /usr/bin/python3 "$listener" "$q1" 3 "$work/wire.$mode.json" "${largs[@]}" &
  listener_pid=$!
  sleep 0.3
  "$hsapd" --socket="$work/w.sock" --port="$q0" --peers="127.0.0.1:$q0,127.0.0.1:$q1" \
    --node_rank=0 "${common[@]}" "${extra[@]}" >"$work/wire.$mode.log" 2>&1 &
  daemon_pid=$!
  wait "$listener_pid"
  # Its static peer never answered: the stop must not wait out the 30 s
  # join timeout (it did).
  local stop_start=$SECONDS
  kill -TERM "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null
  if [ $((SECONDS - stop_start)) -gt 5 ]; then
    fail "hsapd ($mode) took $((SECONDS - stop_start)) s to stop with a peer that never answered"
  else
    ok "hsapd ($mode) stopped in $((SECONDS - stop_start)) s with a peer that never answered"
  fi
}
wire token
wire tls
if /usr/bin/python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
token = "Bearer " + open(f"{work}/token").read().strip()
def calls(report):
    return [v for c in report for k, v in c["headers"] if k == ":path"]
def tokens(report):
    return [v for c in report for k, v in c["headers"] if k == "authorization"]
plain, tls = (json.load(open(f"{work}/wire.{m}.json")) for m in ("token", "tls"))
bad = 0
# The control: without TLS the token is on the wire, and the parser finds it.
if not calls(plain) or token not in tokens(plain):
    print("FAIL: without TLS the listener did not see the token (the check could not fail)"); bad = 1
else:
    print(f"ok: without TLS: {len(calls(plain))} Peer calls in clear, each with the token")
if not tls or not all(c["tls_records_only"] and c["first_bytes"].startswith("16") for c in tls):
    print("FAIL: with TLS the wire held bytes outside TLS records"); bad = 1
elif not calls(tls):
    print("FAIL: with TLS no Peer call was decrypted (nothing was checked)"); bad = 1
elif tokens(tls):
    print(f"FAIL: with TLS the Peer calls carry {tokens(tls)}"); bad = 1
else:
    n = sum(c["wire_bytes"] for c in tls)
    print(f"ok: with TLS: {n} wire bytes, all TLS records; {len(calls(tls))} Peer calls "
          f"({sorted(set(calls(tls)))}) decrypted, none carries a token")
sys.exit(bad)
EOF
then :; else fail "wire check"; fi

# 3. A certificate from another CA cannot join.
section "another CA"
read -r p0 p1 < <(ports 2)
peers="127.0.0.1:$p0,127.0.0.1:$p1"
# shellcheck disable=SC2046
"$hsapd" --socket="$work/c0.sock" --port="$p0" --peers="$peers" --node_rank=0 "${common[@]}" \
  $(tls ca1 a) >"$work/c0.log" 2>&1 &
pids+=($!)
# shellcheck disable=SC2046
"$hsapd" --socket="$work/c1.sock" --port="$p1" --peers="$peers" --node_rank=1 "${common[@]}" \
  $(tls ca2 b) >"$work/c1.log" 2>&1 &
pids+=($!)
sleep 3
for n in 0 1; do
  if grep -q "is UP\|cluster formed" "$work/c$n.log"; then
    fail "node $n formed a cluster with a peer of another CA"
  elif grep -q "certificate verify failed" "$work/c$n.log"; then
    ok "node $n: $(grep -m1 -o 'Handshake failed.*certificate verify failed' "$work/c$n.log")"
  else
    fail "node $n logged no failed handshake"; tail -5 "$work/c$n.log"
  fi
done
for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p"; done
pids=()

# 4. A certificate that does not name the advertised host.
section "a certificate for another host"
read -r p0 < <(ports 1)
# shellcheck disable=SC2046
if "$hsapd" --socket="$work/e.sock" --port="$p0" "${common[@]}" $(tls ca1 elsewhere) \
    >"$work/e.log" 2>&1; then
  fail "hsapd started with a certificate for 127.0.0.2 advertising 127.0.0.1"
elif grep -q "does not name '127.0.0.1'" "$work/e.log"; then
  ok "refused to start: $(grep -o 'INVALID_ARGUMENT.*' "$work/e.log" | cut -c1-160)"
else
  fail "hsapd failed without naming the certificate"; cat "$work/e.log"
fi

if [ "$failures" -gt 0 ]; then
  echo "peer_tls_test: $failures check(s) failed"
  exit 1
fi
echo "peer_tls_test: all checks passed (${SECONDS}s)"

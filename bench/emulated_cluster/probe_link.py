"""Measures one emulated link: TCP goodput and round-trip time.

run.sh starts `probe_link.py serve ADDR PORT` in one node's namespace and
`probe_link.py probe ADDR PORT BYTES` in another's; the probe prints

    goodput_bytes_per_s=<x> rtt_us=<median of 50 one-byte round trips>

Goodput is payload bytes over the time from the first byte sent to the
server's acknowledgement of the last, so TCP/IP headers and the shaper's
accounting are included in what it measures. Every socket has a timeout:
nothing waits forever.
"""

import socket
import statistics
import sys
import time

TIMEOUT_S = 120
PINGS = 50


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def serve(addr, port):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.settimeout(TIMEOUT_S)
    listener.bind((addr, port))
    listener.listen(1)
    conn, _ = listener.accept()
    conn.settimeout(TIMEOUT_S)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    total = int.from_bytes(recv_exact(conn, 8), "little")
    got = 0
    while got < total:
        chunk = conn.recv(min(1 << 20, total - got))
        if not chunk:
            raise ConnectionError("peer closed during the bulk transfer")
        got += len(chunk)
    conn.sendall(b"k")
    for _ in range(PINGS):
        conn.sendall(recv_exact(conn, 1))
    conn.close()
    listener.close()


def probe(addr, port, nbytes):
    conn = None
    deadline = time.time() + 10
    while conn is None:
        try:
            conn = socket.create_connection((addr, port), timeout=TIMEOUT_S)
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    block = b"\0" * (1 << 16)
    start = time.time()
    conn.sendall(nbytes.to_bytes(8, "little"))
    sent = 0
    while sent < nbytes:
        n = min(len(block), nbytes - sent)
        conn.sendall(block[:n])
        sent += n
    recv_exact(conn, 1)
    seconds = time.time() - start
    rtts = []
    for _ in range(PINGS):
        t = time.perf_counter()
        conn.sendall(b"p")
        recv_exact(conn, 1)
        rtts.append((time.perf_counter() - t) * 1e6)
    conn.close()
    print("goodput_bytes_per_s=%.6g rtt_us=%.1f" % (nbytes / seconds, statistics.median(rtts)))


def main(argv):
    if len(argv) == 4 and argv[1] == "serve":
        serve(argv[2], int(argv[3]))
    elif len(argv) == 5 and argv[1] == "probe":
        probe(argv[2], int(argv[3]), int(argv[4]))
    else:
        print("usage: probe_link.py serve ADDR PORT | probe ADDR PORT BYTES", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

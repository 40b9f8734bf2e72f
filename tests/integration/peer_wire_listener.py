#!/usr/bin/env python3
"""Stands in for a peer at 127.0.0.1:PORT and records what a daemon sends it.

  peer_wire_listener.py PORT SECONDS OUT.json [--tls CERT KEY]

Plain: reads the raw bytes of every connection. --tls: terminates TLS
(ALPN h2) with CERT/KEY through memory BIOs, so that both the bytes on the
wire and the decrypted stream are seen. Either way the HTTP/2 stream is
parsed (preface, frames) and every HEADERS block decoded with HPACK
(python3-hpack), and OUT.json gets, per connection: the first wire bytes
(hex), whether the wire held only TLS records, and the decoded headers.
Used by peer_tls_test.sh: with a token and no TLS the daemon's
`authorization` header must be found (the check can fail); with TLS the
wire must hold only TLS records and the decrypted calls no token.
"""
import json
import select
import socket
import ssl
import sys
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class Conn:
    def __init__(self, sock, ctx):
        self.sock = sock
        self.raw = b""
        self.plain = b""
        self.tls = None
        self.settings_sent = False
        if ctx is not None:
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = ctx.wrap_bio(self.inc, self.out, server_side=True)

    def feed(self, data):
        self.raw += data
        if self.tls is None:
            self.plain += data
            if not self.settings_sent:
                self.sock.sendall(EMPTY_SETTINGS)
                self.settings_sent = True
            return
        self.inc.write(data)
        try:
            self.tls.do_handshake()
            if not self.settings_sent:
                self.tls.write(EMPTY_SETTINGS)
                self.settings_sent = True
            while True:
                self.plain += self.tls.read(65536)
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            pass
        except ssl.SSLError as e:
            self.plain += b""  # a failed handshake: the raw bytes still count
            print(f"listener: TLS error: {e}", file=sys.stderr)
        pending = self.out.read()
        if pending:
            self.sock.sendall(pending)


def tls_records_only(raw):
    i = 0
    while i + 5 <= len(raw):
        if raw[i] not in (0x14, 0x15, 0x16, 0x17) or raw[i + 1] != 0x03:
            return False
        i += 5 + int.from_bytes(raw[i + 3:i + 5], "big")
    return True


def headers_of(stream):
    if not stream.startswith(PREFACE):
        return []
    decoder = hpack.Decoder()
    out, i, block = [], len(PREFACE), b""
    while i + 9 <= len(stream):
        length = int.from_bytes(stream[i:i + 3], "big")
        kind, flags = stream[i + 3], stream[i + 4]
        payload = stream[i + 9:i + 9 + length]
        if len(payload) < length:
            break
        i += 9 + length
        if kind == 0x1:  # HEADERS
            if flags & 0x8:  # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if flags & 0x20:  # PRIORITY
                payload = payload[5:]
            block = payload
        elif kind == 0x9:  # CONTINUATION
            block += payload
        else:
            continue
        if flags & 0x4:  # END_HEADERS
            out.extend([str(k), str(v)] for k, v in decoder.decode(block, raw=False))
            block = b""
    return out


def main():
    port, seconds, path = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    ctx = None
    if len(sys.argv) > 4 and sys.argv[4] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[5], sys.argv[6])
        ctx.set_alpn_protocols(["h2"])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    conns, done, end = {}, [], time.time() + seconds
    while time.time() < end:
        ready, _, _ = select.select([listener] + list(conns), [], [], 0.1)
        for s in ready:
            if s is listener:
                c, _ = listener.accept()
                conns[c] = Conn(c, ctx)
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                conns[s].feed(data)
            else:
                done.append(conns.pop(s))
                s.close()
    done.extend(conns.values())
    report = [{
        "first_bytes": c.raw[:8].hex(),
        "wire_bytes": len(c.raw),
        "tls_records_only": tls_records_only(c.raw),
        "headers": headers_of(c.plain),
    } for c in done if c.raw]
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

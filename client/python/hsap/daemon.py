"""A local hsapd child process for tests and examples.

    with hsap.daemon.LocalDaemon(devices="cpu:4") as d:
        client = hsap.connect(d.socket)

The binary is `binary`, else $HSAPD, else the Bazel runfile server/hsapd,
else bazel-bin/server/hsapd of the source tree this package lives in, else
`hsapd` on PATH. The socket lives in a fresh directory under /tmp (Unix socket
paths must stay under 108 bytes). stop() (or leaving the with block) sends
SIGTERM, then SIGKILL after a grace period, and reaps it; no test leaves a
daemon behind.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def find_hsapd(binary=None):
    """The path of the hsapd binary to run (see the module comment)."""
    candidates = [binary, os.environ.get("HSAPD")]
    srcdir = os.environ.get("TEST_SRCDIR") or os.environ.get("RUNFILES_DIR")
    if srcdir:
        candidates.append(os.path.join(srcdir, "hsap", "server", "hsapd"))
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "..", "bazel-bin", "server", "hsapd"))
    candidates.append(shutil.which("hsapd"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise FileNotFoundError("no hsapd binary: build //server:hsapd or set $HSAPD")


class LocalDaemon:
    """hsapd on a temporary socket. `socket`: the gRPC socket path."""

    def __init__(self, devices="cpu:1", binary=None, flags=(), start_timeout=20.0):
        self.binary = find_hsapd(binary)
        self.dir = tempfile.mkdtemp(prefix="hsap-py-", dir="/tmp")
        self.socket = os.path.join(self.dir, "hsapd.sock")
        self.log_path = os.path.join(self.dir, "hsapd.log")
        self._log = open(self.log_path, "wb")
        argv = [self.binary, f"--socket={self.socket}", f"--devices={devices}", *flags]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"hsapd ({' '.join(argv)}) did not start:\n{log[-4000:]}")
            time.sleep(0.05)

    def _accepts(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(self.socket + ".session")
            return True
        except OSError:
            return False
        finally:
            s.close()

    def log(self):
        """What the daemon printed so far."""
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, grace=10.0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

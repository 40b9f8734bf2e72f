"""The client's deadlines and error names against a real hsapd that stops
answering (SIGSTOP) or dies (SIGKILL):

* a forward call of a two-rank group (deadline_ms 1000, the default margin)
  to a stopped daemon fails on each rank with DEADLINE_EXCEEDED after
  deadline + margin (not before, and at most SLACK_S later), naming the
  daemon's socket, the group and the rank; after SIGCONT the daemon serves
  a new group's call that equals the float64 reference;
* the session socket (fd transfer and its ack, the hello of a new session)
  and the other calls give up after timeout_s on a stopped daemon, and the
  session still works after SIGCONT (late acks are skipped);
* after SIGKILL the next call of each rank fails UNAVAILABLE naming the
  socket, the group and the rank, and so do the session socket and connect;
* HsapError keeps its fields through pickle.

Each test starts its own hsapd (it stops or kills it) and prints the
measured times."""

import os
import pickle
import signal
import threading
import time
import unittest

import grpc
import torch

import hsap
import hsap.client
from hsap.daemon import LocalDaemon
from hsap.reference import varlen_attn_reference
from hsap.v1 import attention_pb2

from common import random_qkv, rel_error

RANKS = 2
HQ, HKV, D = 2, 1, 16
CU = [0, 40, 41, 100, 128]
MAX_SEQLEN = 59
DEADLINE_MS = 1000
# How much later than its deadline a call may fail (scheduling, the gRPC
# timer, thread start-up on a loaded 2-core machine).
SLACK_S = 1.5
TOLERANCE = 1e-5


# A call that has not ended after this many seconds hangs (the test fails
# then rather than at Bazel's timeout).
HANG_S = 30.0


def in_thread(fn):
    """Starts fn() in a daemon thread; returns a function that waits up to
    HANG_S for its result (its exception is the result) and asserts it
    ended."""
    box = {}

    def body():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: B036 - returned to the test
            box["result"] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def result():
        thread.join(HANG_S)
        assert not thread.is_alive(), f"the call still blocks after {HANG_S:g} s"
        return box["result"]

    return result


def run_ranks(fn):
    """fn(rank) in RANKS threads at once; the results (or the exceptions) in
    rank order."""
    waits = [in_thread(lambda r=r: fn(r)) for r in range(RANKS)]
    return [wait() for wait in waits]


def timed(fn, *args, **kwargs):
    """(the HsapError fn raised, seconds until it did); None if it returned.
    Runs fn in a thread so that a hang fails the test after HANG_S."""
    def body():
        started = time.monotonic()
        try:
            fn(*args, **kwargs)
        except hsap.HsapError as e:
            return e, time.monotonic() - started
        return None, time.monotonic() - started

    return in_thread(body)()


class DeadlineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.q, cls.k, cls.v, _ = random_qkv(CU[-1], HQ, HKV, D, seed=5)
        cls.ref_out, _ = varlen_attn_reference(cls.q.double(), cls.k.double(), cls.v.double(), CU)

    def setUp(self):
        self.daemon = LocalDaemon(devices=f"cpu:{RANKS}", flags=["--call_deadline_ms=60000"])
        self.addCleanup(self.daemon.stop)
        # Runs first: a stopped daemon takes SIGTERM only once continued.
        self.addCleanup(self.resume)
        self.socket = self.daemon.socket
        self.clients = []
        self.layout = None

    def resume(self):
        if self.daemon.proc.poll() is None:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)

    def stop_daemon(self):
        """SIGSTOP, then waits until every thread of the daemon is stopped (a
        thread running when the signal is sent may still answer otherwise)."""
        pid = self.daemon.proc.pid
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5.0
        while True:
            states = []
            for task in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{task}/stat") as f:
                        states.append(f.read().rpartition(")")[2].split()[0])
                except FileNotFoundError:
                    pass  # the thread ended
            if states and all(state in ("T", "t") for state in states):
                return
            self.assertLess(time.monotonic(), deadline, f"hsapd threads' states: {states}")
            time.sleep(0.01)

    def connect(self, **options):
        client = hsap.connect(self.socket, **options)
        self.addCleanup(client.close)
        self.clients.append(client)
        return client

    def rank_clients(self):
        clients = [self.connect() for _ in range(RANKS)]
        self.layout = hsap.dispatch(CU, RANKS, HQ, HKV, D, client=clients[0])
        return clients

    def groups(self, name, clients):
        return [hsap.Group(name, r, RANKS, client=clients[r], deadline_ms=DEADLINE_MS)
                for r in range(RANKS)]

    def forward(self, groups, r):
        rows = self.layout.indices(r)
        return hsap.varlen_attn(self.q[rows], self.k[rows], self.v[rows], CU, MAX_SEQLEN,
                                group=groups[r])

    def check_forward(self, groups, what):
        """Runs one forward call on every rank; its output, in global order,
        equals the float64 reference."""
        outs = run_ranks(lambda r: self.forward(groups, r))
        out = torch.zeros(CU[-1], HQ, D)
        for r, got in enumerate(outs):
            if isinstance(got, BaseException):
                raise got
            out[self.layout.indices(r)] = got
        err = rel_error(out, self.ref_out)
        self.assertLessEqual(err, TOLERANCE, f"{what}: relative error {err:.3g}")

    def assertNames(self, error, code, group=None, rank=None):
        self.assertIsInstance(error, hsap.HsapError)
        self.assertEqual(error.code, code, str(error))
        self.assertEqual(error.socket_path, self.socket, str(error))
        where = f"hsapd at {self.socket}"
        if group is not None:
            self.assertEqual((error.group, error.rank), (group, rank), str(error))
            where += f", group '{group}' rank {rank}"
        self.assertTrue(str(error).startswith(f"{where}: {code.name}: "), str(error))

    def test_stopped_daemon_fails_forward_at_deadline_plus_margin(self):
        clients = self.rank_clients()
        margin = clients[0].deadline_margin_s
        self.assertEqual(margin, hsap.client.DEADLINE_MARGIN_S)
        expected = DEADLINE_MS / 1000.0 + margin
        groups = self.groups("g-stop", clients)
        # Call 1 runs: the daemon answers, and the arenas the next call
        # reuses are registered (call 2 then needs the daemon for gRPC only).
        self.check_forward(groups, "before SIGSTOP")

        self.stop_daemon()
        outcomes = run_ranks(lambda r: timed(self.forward, groups, r))
        for r, (error, elapsed) in enumerate(outcomes):
            print(f"  SIGSTOP, rank {r}: failed after {elapsed:.3f} s (deadline_ms "
                  f"{DEADLINE_MS} + margin {margin:g} s = {expected:g} s): {error}")
            self.assertNames(error, grpc.StatusCode.DEADLINE_EXCEEDED, "g-stop", r)
            self.assertIn(f"no answer from hsapd within {expected:g} s (the call's deadline_ms "
                          f"{DEADLINE_MS} + margin {margin:g} s)", error.message)
            self.assertTrue(error.no_answer)
            self.assertGreaterEqual(elapsed, expected)
            self.assertLessEqual(elapsed, expected + SLACK_S)

        # The group is spent; its refusal names the daemon, group and rank.
        error, _ = timed(self.forward, groups, 1)
        self.assertNames(error, grpc.StatusCode.FAILED_PRECONDITION, "g-stop", 1)
        self.assertIn("use a new group name", error.message)

        self.resume()
        self.check_forward(self.groups("g-after", clients), "after SIGCONT")

    def test_default_deadline_is_the_daemons(self):
        client = self.connect()
        request = attention_pb2.AttentionForwardRequest()
        self.assertEqual(client.attention_timeout(request),
                         (60.0 + hsap.client.DEADLINE_MARGIN_S,
                          "the daemon's default deadline 60000 ms + margin "
                          f"{hsap.client.DEADLINE_MARGIN_S:g} s"))
        request.options.deadline_ms = 2500
        custom = self.connect(deadline_margin_s=0.5, default_deadline_ms=1000)
        self.assertEqual(custom.attention_timeout(request),
                         (3.0, "the call's deadline_ms 2500 + margin 0.5 s"))
        self.assertEqual(client.timeout_s, hsap.client.DEFAULT_TIMEOUT_S)
        for bad in ({"timeout_s": 0}, {"timeout_s": "soon"}, {"deadline_margin_s": -1},
                    {"default_deadline_ms": float("inf")}):
            with self.assertRaises(hsap.InvalidInputError, msg=str(bad)) as ctx:
                hsap.connect(self.socket, **bad)
            self.assertIn(next(iter(bad)), ctx.exception.message)

    def test_stopped_daemon_session_socket_and_calls_time_out(self):
        timeout = 1.5
        client = self.connect(timeout_s=timeout)
        self.stop_daemon()

        error, elapsed = timed(client.create_region, 1 << 16, "stopped")
        print(f"  SIGSTOP, fd transfer: failed after {elapsed:.3f} s: {error}")
        self.assertNames(error, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn(f"no ack of fd transfer 1 on {self.socket}.session within {timeout:g} s",
                      error.message)
        self.assertGreaterEqual(elapsed, timeout)
        self.assertLessEqual(elapsed, timeout + SLACK_S)

        error, elapsed = timed(client.cluster_status)
        print(f"  SIGSTOP, GetClusterStatus: failed after {elapsed:.3f} s: {error}")
        self.assertNames(error, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn(f"no answer from hsapd within {timeout:g} s (timeout_s)", error.message)
        self.assertGreaterEqual(elapsed, timeout)
        self.assertLessEqual(elapsed, timeout + SLACK_S)

        error, elapsed = timed(hsap.connect, self.socket, timeout_s=timeout)
        print(f"  SIGSTOP, connect: failed after {elapsed:.3f} s: {error}")
        self.assertNames(error, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIn(f"no session hello on {self.socket}.session within {timeout:g} s",
                      error.message)
        self.assertGreaterEqual(elapsed, timeout)
        self.assertLessEqual(elapsed, timeout + SLACK_S)

        # Continued, the daemon acks transfer 1 late; the next transfer skips
        # that ack and registers its own region.
        self.resume()
        region = client.create_region(1 << 16, "resumed")
        region.view(0, (4,), torch.float32).fill_(1.5)
        names = [r.name for r in client.list_regions().regions]
        self.assertIn("resumed", names)
        self.assertEqual(client.cluster_status().self_node_rank, 0)

    def test_killed_daemon_fails_next_call_unavailable_naming_it(self):
        clients = self.rank_clients()
        groups = self.groups("g-kill", clients)
        self.check_forward(groups, "before SIGKILL")

        self.daemon.proc.kill()
        self.daemon.proc.wait()
        outcomes = run_ranks(lambda r: timed(self.forward, groups, r))
        for r, (error, elapsed) in enumerate(outcomes):
            print(f"  SIGKILL, rank {r}: failed after {elapsed:.3f} s: {error}")
            self.assertNames(error, grpc.StatusCode.UNAVAILABLE, "g-kill", r)
            self.assertTrue(error.no_answer)
            self.assertLess(elapsed, 10.0)

        error, _ = timed(clients[0].create_region, 1 << 16, "dead")
        print(f"  SIGKILL, fd transfer: {error}")
        self.assertNames(error, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(f"{self.socket}.session", error.message)

        error, _ = timed(hsap.connect, self.socket)
        print(f"  SIGKILL, connect: {error}")
        self.assertNames(error, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(f"no hsapd session socket at {self.socket}.session", error.message)


class ErrorPicklingTest(unittest.TestCase):
    def test_fields_survive_pickle(self):
        error = hsap.HsapError(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer", "/tmp/x/hsapd.sock",
                               "g", 3)
        error.no_answer = True
        self.assertEqual(str(error),
                         "hsapd at /tmp/x/hsapd.sock, group 'g' rank 3: DEADLINE_EXCEEDED: "
                         "no answer")
        back = pickle.loads(pickle.dumps(error))
        self.assertIs(type(back), hsap.HsapError)
        self.assertEqual((back.code, back.message, back.socket_path, back.group, back.rank,
                          back.no_answer, str(back)),
                         (error.code, error.message, error.socket_path, error.group,
                          error.rank, True, str(error)))
        bad = pickle.loads(pickle.dumps(hsap.InvalidDTypeError("q.dtype is torch.int8")))
        self.assertIsInstance(bad, TypeError)
        self.assertEqual(str(bad), "INVALID_ARGUMENT: q.dtype is torch.int8")
        self.assertEqual(hsap.HsapError(grpc.StatusCode.ABORTED, "x", group="g", rank=0)
                         .located_message, "group 'g' rank 0: x")


if __name__ == "__main__":
    unittest.main(verbosity=2)

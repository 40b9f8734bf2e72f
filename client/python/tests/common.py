"""Shared by the hsap client tests: a daemon per test class, random
problems and the relative error used against the float64 reference."""

import unittest

import torch

from hsap.daemon import LocalDaemon


def rel_error(got, want):
    """max |got - want| / max |want| over finite entries; entries equal in
    both (e.g. -inf LSE of rows that see no key) count as exact."""
    got = got.detach().double()
    want = want.detach().double()
    same = got == want
    if bool(same.all()):
        return 0.0
    if not bool(torch.isfinite(got[~same]).all()) or not bool(torch.isfinite(want[~same]).all()):
        return float("inf")
    diff = (got - want)[~same].abs().max().item()
    scale = want[torch.isfinite(want)].abs().max().item()
    return diff / (scale if scale > 1e-12 else 1.0)


def random_qkv(tokens, hq, hkv, d, dtype=torch.float32, seed=0):
    """q [T, Hq, D], k and v [T, Hkv, D], dO [T, Hq, D], uniform in [-1, 1)."""
    g = torch.Generator().manual_seed(seed)

    def uni(*shape):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)

    return uni(tokens, hq, d), uni(tokens, hkv, d), uni(tokens, hkv, d), uni(tokens, hq, d)


class DaemonTestCase(unittest.TestCase):
    """Starts one hsapd (the Bazel data dependency, see hsap.daemon) per class."""

    devices = "cpu:1"

    @classmethod
    def setUpClass(cls):
        cls.daemon = LocalDaemon(devices=cls.devices, flags=["--call_deadline_ms=60000"])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()


def rounding_yardstick(want, dtype, floor=1e-5):
    """The error of the float64 result `want` rounded to `dtype` (the best a
    kernel storing that dtype can do), at least `floor`."""
    return max(rel_error(want.to(dtype), want), floor)


def run_threads(n, fn):
    """Runs fn(rank) in n threads (one per rank of a group); returns the
    results in rank order, raises the first exception."""
    import threading
    results, errors = [None] * n, [None] * n

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: B036 - re-raised below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


def reference_grads(fn, inputs, d_out):
    """(out, lse, [grad of each input]) of the float64 reference fn(*inputs)
    -> (out, lse), with d_out as the output gradient."""
    xs = [x.detach().double().requires_grad_() for x in inputs]
    out, lse = fn(*xs)
    out.backward(d_out.double())
    return out.detach(), lse.detach(), [x.grad for x in xs]

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

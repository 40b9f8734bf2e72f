"""hsap.varlen_attn with 4-rank groups through one hsapd (--devices=cpu:4):
each rank is a thread with its own session holding only its hsap.dispatch
tokens; forward output, LSE and gradients, reassembled in global order, equal
the float64 PyTorch reference on the whole problem (fp32 relative error <=
1e-5) for every strategy x assignment that runs on 1 x 4. Calls keep
numbering across steps; a rank with the wrong token count fails the call."""

import threading
import unittest

import torch

import hsap
from hsap.reference import varlen_attn_reference

from common import DaemonTestCase, random_qkv, rel_error

RANKS = 4
HQ, HKV, D = 4, 2, 32
CU = [0, 7, 7, 130, 131, 200, 333]
MAX_SEQLEN = 133
TOLERANCE = 1e-5


def run_ranks(fn):
    """Runs fn(rank) in RANKS threads; returns the results, raises the first
    exception."""
    results, errors = [None] * RANKS, [None] * RANKS

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: B036 - re-raised below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


class MultiRankTest(DaemonTestCase):
    devices = f"cpu:{RANKS}"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        total = CU[-1]
        cls.q, cls.k, cls.v, cls.d_o = random_qkv(total, HQ, HKV, D, seed=11)
        q64, k64, v64 = (x.double().requires_grad_() for x in (cls.q, cls.k, cls.v))
        cls.ref_out, cls.ref_lse = varlen_attn_reference(q64, k64, v64, CU)
        cls.ref_out.backward(cls.d_o.double())
        cls.ref_dq, cls.ref_dk, cls.ref_dv = q64.grad, k64.grad, v64.grad
        cls.clients = [hsap.connect(cls.daemon.socket) for _ in range(RANKS)]
        cls.group_id = 0

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients:
            c.close()
        super().tearDownClass()

    def new_groups(self, assignment, clients=None, deadline_ms=0):
        MultiRankTest.group_id += 1
        name = f"mr-{MultiRankTest.group_id}"
        clients = clients or self.clients
        return [hsap.Group(name, r, RANKS, client=clients[r], assignment=assignment,
                           deadline_ms=deadline_ms) for r in range(RANKS)]

    def run_group(self, strategy, assignment, groups, steps=1):
        """Forward + backward of every rank `steps` times; returns the
        reassembled out, lse, dq, dk, dv of the last step."""
        layout = hsap.dispatch(CU, RANKS, HQ, HKV, D, torch.float32, strategy, assignment,
                               client=self.clients[0])
        self.assertEqual(sum(layout.tokens(r) for r in range(RANKS)), CU[-1])

        def rank(r):
            rows = layout.indices(r)
            for _ in range(steps):
                q, k, v = (x[rows].clone().requires_grad_() for x in (self.q, self.k, self.v))
                out, lse = hsap.varlen_attn(q, k, v, CU, MAX_SEQLEN, group=groups[r],
                                            strategy=strategy, return_lse=True)
                out.backward(self.d_o[rows])
            return rows, out.detach(), lse, q.grad, k.grad, v.grad

        got = {n: torch.zeros_like(t) for n, t in (("out", self.q), ("dq", self.q),
                                                     ("dk", self.k), ("dv", self.v))}
        got["lse"] = torch.zeros(HQ, CU[-1])
        for rows, out, lse, dq, dk, dv in run_ranks(rank):
            self.assertEqual(tuple(out.shape), (len(rows), HQ, D))
            self.assertEqual(tuple(lse.shape), (HQ, len(rows)))
            got["out"][rows], got["lse"][:, rows] = out, lse
            got["dq"][rows], got["dk"][rows], got["dv"][rows] = dq, dk, dv
        return layout, got

    def check(self, got, what):
        for name, want in (("out", self.ref_out), ("lse", self.ref_lse), ("dq", self.ref_dq),
                           ("dk", self.ref_dk), ("dv", self.ref_dv)):
            err = rel_error(got[name], want)
            self.assertLessEqual(err, TOLERANCE, f"{what} {name}: relative error {err:.3g}")

    def test_every_strategy_and_assignment_equals_the_reference(self):
        combos = 0
        for strategy in ("ring", "allgather", "ulysses", "usp", "sap", "hsap", "auto"):
            for assignment in ("contiguous", "zigzag", "balanced"):
                with self.subTest(strategy=strategy, assignment=assignment):
                    try:
                        layout, got = self.run_group(strategy, assignment,
                                                     self.new_groups(assignment))
                    except hsap.HsapError as e:
                        # Strategies that cannot run on this shape say so.
                        self.assertEqual(e.code.name, "INVALID_ARGUMENT", e.message)
                        continue
                    combos += 1
                    print(f"  {strategy}/{assignment}: ran {layout.strategy}")
                    self.check(got, f"{strategy}/{assignment} ({layout.strategy})")
        self.assertGreaterEqual(combos, 12)

    def test_one_shared_client_and_several_steps(self):
        # All four ranks through one session: concurrent calls take separate
        # arenas. Three steps: each rank's calls are numbered 1..6.
        shared = [self.clients[0]] * RANKS
        groups = self.new_groups("balanced", shared)
        _, got = self.run_group("auto", "balanced", groups, steps=3)
        self.check(got, "shared client")
        self.assertEqual([g.call_seq for g in groups], [6] * RANKS)

    def test_wrong_local_token_count_fails_with_the_daemons_message(self):
        layout = hsap.dispatch(CU, RANKS, HQ, HKV, D, client=self.clients[0])
        groups = self.new_groups("balanced", deadline_ms=1500)

        def rank(r):
            n = layout.tokens(r) + (1 if r == 2 else 0)
            q, k, v = self.q[:n].clone(), self.k[:n].clone(), self.v[:n].clone()
            try:
                hsap.varlen_attn(q, k, v, CU, MAX_SEQLEN, group=groups[r])
            except hsap.HsapError as e:
                return e
            return None

        errors = run_ranks(rank)
        self.assertIsInstance(errors[2], hsap.HsapError)
        self.assertEqual(errors[2].code.name, "INVALID_ARGUMENT")
        self.assertIn("q.shape[0] is", errors[2].message)
        self.assertIn("dispatch", errors[2].message)
        # The others wait for rank 2, which never arrives: the call fails
        # when the group's deadline passes, naming the missing rank.
        for r in (0, 1, 3):
            self.assertIsInstance(errors[r], hsap.HsapError, f"rank {r}")
            self.assertEqual(errors[r].code.name, "DEADLINE_EXCEEDED", errors[r].message)
        # The groups are spent after a daemon error.
        with self.assertRaises(hsap.HsapError) as ctx:
            q = self.q[:layout.tokens(0)].clone()
            hsap.varlen_attn(q, q[:, :HKV].contiguous(), q[:, :HKV].contiguous(), CU, MAX_SEQLEN,
                             group=groups[0])
        self.assertEqual(ctx.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("use a new group name", ctx.exception.message)


if __name__ == "__main__":
    unittest.main(verbosity=2)

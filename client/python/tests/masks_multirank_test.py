"""Every hsap.masks kind on groups of 4 ranks through one hsapd
(--devices=cpu:4): each rank is a thread with its own session holding only
the rows hsap.dispatch(mask, ...) gives it (the dispatch covers every token
exactly once); forward output, LSE and gradients, reassembled in global
order, equal the float64 reference on the whole problem (fp32 relative error
<= 1e-5). The kinds: documents with per-document causal/bidirectional flags,
flash_attn_varlen_func with query and key documents of different lengths
(equal totals) and a two-sided window, shared-prefix packs, MagiAttention
ranges with all four types (under every strategy), explicit slices. A mask
whose query and key totals differ is refused for a group of several ranks."""

import unittest

import torch

import hsap
from hsap import masks
from hsap.reference import flash_varlen_mask, masked_reference

from common import DaemonTestCase, reference_grads, rel_error, run_threads
from masks_test import magi_dense, shared_prefix_dense

RANKS = 4
HQ, HKV, D = 4, 2, 16
TOLERANCE = 1e-5


class MasksMultiRankTest(DaemonTestCase):
    devices = f"cpu:{RANKS}"
    group_id = 0

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.clients = [hsap.connect(cls.daemon.socket) for _ in range(RANKS)]

    @classmethod
    def tearDownClass(cls):
        for c in cls.clients:
            c.close()
        super().tearDownClass()

    def run_group(self, mask, allowed, strategy="auto", call=None, seed=0):
        """Dispatch, forward + backward on 4 ranks, compare with the reference;
        returns the strategy auto chose. `call(q, k, v, group)` -> (out, lse)
        replaces hsap.masked_attn when given."""
        total = mask.num_q
        gen = torch.Generator().manual_seed(seed)

        def uni(*shape):
            return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).float()

        q, k, v, d_o = uni(total, HQ, D), uni(total, HKV, D), uni(total, HKV, D), uni(total, HQ, D)
        layout = hsap.dispatch(mask, RANKS, HQ, HKV, D, strategy=strategy, client=self.clients[0])
        covered = torch.cat([layout.indices(r) for r in range(RANKS)]).sort().values
        self.assertTrue(torch.equal(covered, torch.arange(total)), "dispatch covers each token once")
        MasksMultiRankTest.group_id += 1
        name = f"masks-{MasksMultiRankTest.group_id}"
        groups = [hsap.Group(name, r, RANKS, client=self.clients[r]) for r in range(RANKS)]

        def rank(r):
            rows = layout.indices(r)
            ql, kl, vl = (x[rows].clone().requires_grad_() for x in (q, k, v))
            if call is None:
                out, lse = hsap.masked_attn(ql, kl, vl, mask, group=groups[r], strategy=strategy,
                                            return_lse=True)
            else:
                out, lse = call(ql, kl, vl, groups[r], strategy)
            out.backward(d_o[rows])
            return rows, out.detach(), lse, ql.grad, kl.grad, vl.grad

        got = {"out": torch.zeros_like(q), "dq": torch.zeros_like(q), "dk": torch.zeros_like(k),
               "dv": torch.zeros_like(v), "lse": torch.zeros(HQ, total)}
        for rows, out, lse, dq, dk, dv in run_threads(RANKS, rank):
            got["out"][rows], got["lse"][:, rows] = out, lse
            got["dq"][rows], got["dk"][rows], got["dv"][rows] = dq, dk, dv
        ref_out, ref_lse, (rdq, rdk, rdv) = reference_grads(
            lambda a, b, c: masked_reference(a, b, c, allowed), (q, k, v), d_o)
        for name, want in (("out", ref_out), ("lse", ref_lse), ("dq", rdq), ("dk", rdk),
                           ("dv", rdv)):
            err = rel_error(got[name], want)
            self.assertLessEqual(err, TOLERANCE, f"{mask} {strategy} {name}: error {err:.3g}")
        return layout.strategy

    def test_documents_with_per_document_flags(self):
        cu = [0, 60, 61, 150, 200, 201, 260]
        flags = [True, False, True, "full", "causal", False]
        bools = [True, False, True, False, True, False]
        ran = self.run_group(masks.documents(cu, flags), flash_varlen_mask(cu, cu, bools))
        print(f"  per-document flags: auto ran {ran}")

    def test_flash_varlen_with_unequal_documents_and_window(self):
        cu_q, cu_k = [0, 30, 130, 131, 240], [0, 70, 120, 200, 240]
        window = (20, 6)

        def call(q, k, v, group, strategy):
            out, lse, _ = hsap.flash_attn_varlen_func(
                q, k, v, cu_q, cu_k, 109, 80, causal=False, window_size=window,
                return_attn_probs=True, group=group, strategy=strategy)
            return out, lse

        ran = self.run_group(masks.varlen(cu_q, cu_k, False, window),
                             flash_varlen_mask(cu_q, cu_k, False, window), call=call, seed=1)
        print(f"  flash varlen q != k, window {window}: auto ran {ran}")

    def test_shared_prefix(self):
        groups = [(70, [30, 45, 2]), (25, [40, 38])]
        ran = self.run_group(masks.shared_prefix(groups), shared_prefix_dense(groups), seed=2)
        print(f"  shared prefix: auto ran {ran}")

    def test_magi_four_types_under_every_strategy(self):
        q_ranges = [(0, 64), (64, 100), (100, 150), (150, 190), (190, 250)]
        k_ranges = [(0, 64), (0, 40), (64, 150), (100, 190), (150, 180)]
        ints = [1, 3, 2, 0, 2]
        mask = masks.magi(q_ranges, k_ranges, ints, 250, 250)
        allowed = magi_dense(q_ranges, k_ranges, ints, 250, 250)
        ran = {}
        for strategy in ("ring", "allgather", "ulysses", "usp", "sap", "hsap", "auto"):
            with self.subTest(strategy=strategy):
                ran[strategy] = self.run_group(mask, allowed, strategy, seed=3)
        print(f"  magi: strategies ran {ran}")
        self.assertEqual(len(ran), 7)

    def test_explicit_slices(self):
        slices = [(0, 90, 0, 90, "causal", 0, 10), (90, 200, 0, 90, "full"),
                  (90, 200, 90, 200, "causal", -5, -1), (200, 220, 150, 220, "causal", 200, 30)]
        mask = masks.from_slices(slices, 220)
        ran = self.run_group(mask, mask.dense(), seed=4)
        print(f"  explicit slices: auto ran {ran}")

    def test_unequal_totals_are_refused_for_several_ranks(self):
        group = hsap.Group("masks-unequal", 0, RANKS, client=self.clients[0])
        q = torch.zeros(10, HQ, D)
        k = torch.zeros(10, HKV, D)
        with self.assertRaises(hsap.InvalidInputError) as ctx:
            hsap.flash_attn_varlen_func(q, k, k, [0, 40], [0, 60], 40, 60, group=group)
        self.assertIn("40 query rows but 60 key rows", str(ctx.exception))
        self.assertIn("one-rank groups only", str(ctx.exception))
        with self.assertRaises(hsap.InvalidInputError) as ctx:
            hsap.dispatch(masks.varlen([0, 40], [0, 60]), RANKS, HQ, HKV, D,
                          client=self.clients[0])
        self.assertIn("40 query rows but 60 key rows", str(ctx.exception))
        self.assertEqual(group.call_seq, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""hsap.masks: every mask kind lowers to slices that allow exactly the pairs
its definition allows (dense masks built here from the definitions, not from
the slices), bad masks are refused by name, and hsap.masked_attn computes each
kind exactly on a one-rank group (fp32 relative error <= 1e-5 for out, LSE,
dQ, dK, dV against the float64 reference). The kinds: documents with
per-document causal/bidirectional flags, flash-attention varlen (bottom-right
alignment, (left, right) windows, query and key documents of different
lengths), shared-prefix packs, MagiAttention's (q_ranges, k_ranges,
attn_type_map) with full / causal / inv_causal / bi_causal, explicit slices.
Groups of 4 ranks: masks_multirank_test.py."""

import random
import unittest

import torch

import hsap
from hsap import masks
from hsap.reference import flash_varlen_mask, masked_reference

from common import DaemonTestCase, reference_grads, rel_error

FP32_TOLERANCE = 1e-5


def magi_dense(q_ranges, k_ranges, types, nq, nk):
    """MagiAttention's definition, cell by cell (global indices): causal
    j <= i + (k_end - q_end); inv_causal j >= i + (k_start - q_start);
    bi_causal both; full everything in the rectangle."""
    allowed = torch.zeros(nq, nk, dtype=torch.bool)
    for (q0, q1), (k0, k1), t in zip(q_ranges, k_ranges, types):
        for i in range(q0, q1):
            for j in range(k0, k1):
                below = j <= i + (k1 - q1)
                above = j >= i + (k0 - q0)
                allowed[i, j] = {0: True, 1: below, 2: above, 3: below and above}[t]
    return allowed


def shared_prefix_dense(groups, prefix_causal=True):
    """Answers see their group's prefix and themselves causally; the prefix
    sees itself (causally when prefix_causal); nothing else."""
    owner = []  # per token: (group, part) with part -1 for the prefix
    for g, (prefix, answers) in enumerate(groups):
        owner += [(g, -1)] * prefix
        for a, n in enumerate(answers):
            owner += [(g, a)] * n
    t = len(owner)
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for i in range(t):
        for j in range(t):
            (gi, pi), (gj, pj) = owner[i], owner[j]
            if gi != gj:
                continue
            if pj == -1:
                allowed[i, j] = pi != -1 or not prefix_causal or j <= i
            elif pi == pj:
                allowed[i, j] = j <= i
    return allowed


def random_cu(rng, docs, max_len):
    cu = [0]
    for _ in range(docs):
        cu.append(cu[-1] + rng.choice([0, 1, rng.randint(1, max_len)]))
    return cu


class LoweringTest(unittest.TestCase):
    """No daemon: slices against definitions."""

    def test_flash_varlen_equals_the_documented_rule(self):
        rng = random.Random(1)
        windows = [(-1, -1), (-1, 0), (0, 0), (0, -1), (3, -1), (-1, 2), (2, 5), (7, 0), (50, 50)]
        cases = 0
        for _ in range(60):
            docs = rng.randint(1, 4)
            cu_q, cu_k = random_cu(rng, docs, 12), random_cu(rng, docs, 12)
            for causal in (False, True):
                for window in windows:
                    got = masks.varlen(cu_q, cu_k, causal, window).dense()
                    want = flash_varlen_mask(cu_q, cu_k, causal, window)
                    self.assertTrue(torch.equal(got, want), f"{cu_q} {cu_k} {causal} {window}")
                    cases += 1
        self.assertEqual(cases, 60 * 2 * len(windows))

    def test_per_document_flags(self):
        cu = [0, 5, 9, 9, 20, 21]
        flags = [True, False, "full", "causal", "bidirectional"]
        bools = [True, False, False, True, False]
        for window in ((-1, -1), (2, 1)):
            got = masks.documents(cu, flags, window).dense()
            self.assertTrue(torch.equal(got, flash_varlen_mask(cu, cu, bools, window)))
        # Uniform flags keep the compact cu_seqlens wire form; mixed ones use slices.
        self.assertTrue(masks.documents(cu, True).mask_spec().HasField("cu_seqlens"))
        self.assertTrue(masks.documents(cu, [True] * 5, (4, 0)).mask_spec().HasField("cu_seqlens"))
        self.assertTrue(masks.documents(cu, flags).mask_spec().HasField("slices"))
        self.assertTrue(masks.documents(cu, False, (1, 1)).mask_spec().HasField("slices"))

    def test_magi_types(self):
        rng = random.Random(2)
        for _ in range(40):
            q_ranges, k_ranges, types, q, k = [], [], [], 0, 0
            for _ in range(rng.randint(1, 5)):
                lq, lk = rng.randint(0, 9), rng.randint(0, 9)
                q_ranges.append((q, q + lq))
                k_ranges.append((k, k + lk))
                types.append(rng.randint(0, 3))
                q, k = q + lq, k + lk
            got = masks.magi(q_ranges, k_ranges, types, q, k).dense()
            self.assertTrue(torch.equal(got, magi_dense(q_ranges, k_ranges, types, q, k)),
                            f"{q_ranges} {k_ranges} {types}")
        # Names and tensors as MagiAttention passes them.
        m = masks.magi(torch.tensor([[0, 4], [4, 9]], dtype=torch.int32),
                       torch.tensor([[0, 6], [0, 9]], dtype=torch.int32),
                       torch.tensor([3, 2], dtype=torch.int32))
        n = masks.magi([(0, 4), (4, 9)], [(0, 6), (0, 9)], ["bi_causal", "inv_causal"])
        self.assertEqual(m, n)
        self.assertEqual((m.num_q, m.num_k), (9, 9))

    def test_shared_prefix(self):
        groups = [(5, [3, 0, 4]), (0, [2]), (3, [])]
        for prefix_causal in (True, False):
            got = masks.shared_prefix(groups, prefix_causal).dense()
            self.assertTrue(torch.equal(got, shared_prefix_dense(groups, prefix_causal)))

    def test_bad_masks_are_refused_by_name(self):
        def refused(pieces, fn, *args):
            with self.assertRaises(hsap.InvalidInputError) as ctx:
                fn(*args)
            for p in pieces:
                self.assertIn(p, str(ctx.exception))

        refused(["overlap", "disjoint"], masks.from_slices,
                [(0, 4, 0, 4, "causal"), (2, 6, 3, 5, "full")], 8)
        refused(["slices[0] key range [0, 9)", "[0, 8)"], masks.from_slices, [(0, 4, 0, 9)], 8)
        refused(["'full' but has offset 2"], masks.from_slices, [(0, 4, 0, 4, "full", 2)], 8)
        refused(["type is 'diagonal'"], masks.from_slices, [(0, 4, 0, 4, "diagonal")], 8)
        refused(["attn_type_map[1] is 7"], masks.magi, [(0, 2), (2, 4)], [(0, 2), (2, 4)], [0, 7])
        refused(["q_ranges has 2 ranges but k_ranges has 1"], masks.magi, [(0, 2), (2, 4)],
                [(0, 2)], [0, 0])
        refused(["overlap"], masks.magi, [(0, 4), (2, 6)], [(0, 4), (0, 4)], [0, 1])
        refused(["groups[0]"], masks.shared_prefix, [(3,)])
        refused(["cu_seqlens_q has 1 documents but cu_seqlens_k has 2"], masks.varlen,
                [0, 3], [0, 1, 3])


class MaskedAttnTest(DaemonTestCase):
    """Each mask kind through hsapd on a one-rank group."""

    def setUp(self):
        self.client = hsap.connect(self.daemon.socket)

    def tearDown(self):
        self.client.close()

    def check(self, mask, allowed, hq=4, hkv=2, d=32, seed=0):
        gen = torch.Generator().manual_seed(seed)

        def uni(*shape):
            return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).float()

        q = uni(mask.num_q, hq, d).requires_grad_()
        k = uni(mask.num_k, hkv, d).requires_grad_()
        v = uni(mask.num_k, hkv, d).requires_grad_()
        d_o = uni(mask.num_q, hq, d)
        out, lse = hsap.masked_attn(q, k, v, mask, return_lse=True, client=self.client)
        out.backward(d_o)
        ref_out, ref_lse, (rdq, rdk, rdv) = reference_grads(
            lambda a, b, c: masked_reference(a, b, c, allowed), (q, k, v), d_o)
        for name, got, want in (("out", out, ref_out), ("lse", lse, ref_lse), ("dq", q.grad, rdq),
                                ("dk", k.grad, rdk), ("dv", v.grad, rdv)):
            err = rel_error(got, want)
            self.assertLessEqual(err, FP32_TOLERANCE, f"{mask} {name}: error {err:.3g}")

    def test_documents_causal_and_bidirectional(self):
        cu = [0, 40, 41, 100, 160, 161, 200]
        flags = [True, False, True, "full", "causal", False]
        bools = [True, False, True, False, True, False]
        self.check(masks.documents(cu, flags), flash_varlen_mask(cu, cu, bools))
        self.check(masks.documents(cu, flags, (6, 2)), flash_varlen_mask(cu, cu, bools, (6, 2)),
                   seed=1)

    def test_varlen_queries_and_keys_of_different_lengths(self):
        cu_q, cu_k = [0, 10, 80, 81, 120], [0, 60, 70, 71, 71]
        self.check(masks.varlen(cu_q, cu_k, True, (9, -1)),
                   flash_varlen_mask(cu_q, cu_k, True, (9, -1)))

    def test_shared_prefix(self):
        groups = [(40, [20, 35, 1]), (17, [30, 25])]
        self.check(masks.shared_prefix(groups), shared_prefix_dense(groups), seed=2)
        self.check(masks.shared_prefix(groups, prefix_causal=False),
                   shared_prefix_dense(groups, False), seed=3)

    def test_magi_four_types_square_and_not(self):
        q_ranges = [(0, 50), (50, 90), (90, 150), (150, 170), (0, 50)]
        k_ranges = [(0, 50), (0, 90), (60, 150), (100, 160), (160, 200)]
        types = [1, 3, 2, 0, 3]
        self.check(masks.magi(q_ranges, k_ranges, types, 170, 200),
                   magi_dense(q_ranges, k_ranges, types, 170, 200), seed=4)
        # Square, every type, more queries than keys in a bi-causal slice (empty).
        q_ranges = [(0, 64), (64, 100), (100, 130), (130, 160)]
        k_ranges = [(0, 64), (0, 20), (64, 130), (120, 160)]
        types = ["causal", "bi_causal", "inv_causal", "full"]
        ints = [1, 3, 2, 0]
        self.check(masks.magi(q_ranges, k_ranges, types),
                   magi_dense(q_ranges, k_ranges, ints, 160, 160), seed=5)

    def test_explicit_slices(self):
        slices = [(0, 30, 0, 30, "causal", -3, 5), (30, 60, 0, 45, "causal", 50, -1),
                  (30, 60, 45, 50, "full"), (60, 64, 10, 20, "causal", 100, 3)]
        mask = masks.from_slices(slices, 64)
        want = torch.zeros(64, 64, dtype=torch.bool)
        for qb, qe, kb, ke, *rule in slices:
            s = masks.Slice(qb, qe, kb, ke, rule[0], *(rule[1:] + [0, -1][len(rule) - 1:]))
            for i in range(qb, qe):
                for j in range(kb, ke):
                    want[i, j] = s.allows(i, j)
        self.check(mask, want, seed=6)


if __name__ == "__main__":
    unittest.main(verbosity=2)

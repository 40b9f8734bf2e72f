"""hsap.flash_attn_varlen_func and its packed variants on one-rank groups:
flash-attention 2's signatures and defaults, its return conventions, and its
results against a float64 reference built from flash-attention's documented
rule (hsap.reference.flash_varlen_mask, not hsap.masks' slice lowering):
fp32 relative error <= 1e-5 for out, LSE, dQ, dK, dV; bf16/fp16 within 2x
the error of the float64 result rounded to the dtype. Head dims 1, 8, 59, 80,
96, 160, 224, 256; query and key documents of different lengths (bottom-right
causal alignment, documents empty on one side); windows (left, right) with
either side unlimited, causal or not; every refused argument's message."""

import inspect
import unittest

import torch

import hsap
from hsap.reference import flash_varlen_reference

from common import DaemonTestCase, reference_grads, rel_error, rounding_yardstick

FP32_TOLERANCE = 1e-5
# (name, default) of flash-attention 2.x's parameters (flash_attn_interface.py);
# hsap adds keyword-only group, strategy and client.
_TAIL = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
         ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
         ("deterministic", False), ("return_attn_probs", False)]
_NONE = inspect.Parameter.empty
FLASH_SIGNATURES = {
    "flash_attn_varlen_func": [("q", _NONE), ("k", _NONE), ("v", _NONE), ("cu_seqlens_q", _NONE),
                               ("cu_seqlens_k", _NONE), ("max_seqlen_q", _NONE),
                               ("max_seqlen_k", _NONE)] + _TAIL + [("block_table", None)],
    "flash_attn_varlen_kvpacked_func": [("q", _NONE), ("kv", _NONE), ("cu_seqlens_q", _NONE),
                                        ("cu_seqlens_k", _NONE), ("max_seqlen_q", _NONE),
                                        ("max_seqlen_k", _NONE)] + _TAIL,
    "flash_attn_varlen_qkvpacked_func": [("qkv", _NONE), ("cu_seqlens", _NONE),
                                         ("max_seqlen", _NONE)] + _TAIL,
}

CU_Q = [0, 1, 10, 30, 30, 64, 70]   # documents of q: 1, 9, 20, 0, 34, 6 tokens
CU_K = [0, 7, 8, 50, 60, 61, 61]    # documents of k: 7, 1, 42, 10, 1, 0 tokens


def longest(cu):
    return max(cu[i + 1] - cu[i] for i in range(len(cu) - 1))


def uniform(shape, dtype, gen):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)


class FlashApiTest(DaemonTestCase):
    def setUp(self):
        self.client = hsap.connect(self.daemon.socket)

    def tearDown(self):
        self.client.close()

    def check(self, cu_q, cu_k, hq=4, hkv=2, d=32, causal=False, window_size=(-1, -1),
              dtype=torch.float32, softmax_scale=None, seed=0):
        """One forward + backward against the float64 reference; returns the
        worst error (fp32) or error / yardstick (16-bit)."""
        gen = torch.Generator().manual_seed(seed)
        q = uniform((cu_q[-1], hq, d), dtype, gen).requires_grad_()
        k = uniform((cu_k[-1], hkv, d), dtype, gen).requires_grad_()
        v = uniform((cu_k[-1], hkv, d), dtype, gen).requires_grad_()
        d_o = uniform((cu_q[-1], hq, d), dtype, gen)
        out, lse, probs = hsap.flash_attn_varlen_func(
            q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32),
            longest(cu_q), longest(cu_k), softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, return_attn_probs=True, client=self.client)
        out.backward(d_o)
        self.assertIsNone(probs)
        self.assertEqual((out.dtype, tuple(out.shape)), (dtype, (cu_q[-1], hq, d)))
        self.assertEqual((lse.dtype, tuple(lse.shape)), (torch.float32, (hq, cu_q[-1])))
        ref_out, ref_lse, (rdq, rdk, rdv) = reference_grads(
            lambda a, b, c: flash_varlen_reference(a, b, c, cu_q, cu_k, causal, window_size,
                                                   softmax_scale), (q, k, v), d_o)
        worst = 0.0
        what = f"D={d} {dtype} causal={causal} window={window_size}"
        for name, got, want in (("out", out, ref_out), ("lse", lse, ref_lse), ("dq", q.grad, rdq),
                                ("dk", k.grad, rdk), ("dv", v.grad, rdv)):
            err = rel_error(got, want)
            if dtype == torch.float32 or name == "lse":  # LSE is fp32 whatever the dtype
                self.assertLessEqual(err, FP32_TOLERANCE, f"{what} {name}: error {err:.3g}")
                worst = max(worst, err) if dtype == torch.float32 else worst
            else:
                yardstick = rounding_yardstick(want, dtype)
                self.assertLessEqual(err, 2 * yardstick, f"{what} {name}: error {err:.3g}, "
                                     f"rounding alone {yardstick:.3g}")
                worst = max(worst, err / yardstick)
        return worst

    def test_signatures_are_flash_attentions(self):
        for name, expected in FLASH_SIGNATURES.items():
            params = inspect.signature(getattr(hsap, name)).parameters.values()
            positional = [(p.name, p.default) for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
            keyword = [(p.name, p.default) for p in params if p.kind == p.KEYWORD_ONLY]
            self.assertEqual(positional, expected, name)
            self.assertEqual(keyword, [("group", None), ("strategy", "auto"), ("client", None)],
                             name)

    def test_head_dims_from_1_to_256(self):
        cu = [0, 17, 40, 41, 64]
        for d in (1, 8, 59, 80, 96, 160, 224, 256):
            worst = {}
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                worst[str(dtype)] = self.check(cu, cu, hq=2, hkv=1, d=d, causal=True, dtype=dtype,
                                               seed=d)
            print(f"  D={d}: worst fp32 error, 16-bit error/rounding: {worst}")

    def test_query_and_key_documents_of_different_lengths(self):
        for causal in (True, False):
            for dtype in (torch.float32, torch.bfloat16):
                self.check(CU_Q, CU_K, causal=causal, dtype=dtype, seed=int(causal))
        # The shorter side padded either way: more keys than queries overall.
        self.check([0, 3, 40], [0, 30, 90], causal=True, d=64, seed=7)

    def test_windows_causal_or_not(self):
        windows = [(-1, -1), (-1, 0), (-1, 3), (4, -1), (4, 0), (4, 6), (0, 0), (0, -1),
                   (2, 9), (100, 100)]
        for causal in (False, True):
            for window in windows:
                self.check(CU_Q, CU_K, hq=2, hkv=2, d=16, causal=causal, window_size=window,
                           seed=window[0] + 3 * window[1])
        # Equal documents too (the compact cu_seqlens form for causal windows).
        cu = [0, 50, 51, 90]
        for causal, window in ((True, (5, 0)), (False, (3, 2)), (False, (-1, 0)), (True, (-1, 7))):
            self.check(cu, cu, causal=causal, window_size=window, seed=11)

    def test_scale_gqa_and_mqa(self):
        self.check(CU_Q, CU_K, hq=6, hkv=3, d=24, causal=True, softmax_scale=0.7, seed=3)
        self.check(CU_Q, CU_K, hq=4, hkv=1, d=24, causal=False, softmax_scale=0.05, seed=4)

    def test_packed_variants_send_gradients_to_the_packed_tensor(self):
        gen = torch.Generator().manual_seed(5)
        cu = torch.tensor([0, 20, 21, 64], dtype=torch.int32)
        qkv = uniform((64, 3, 4, 32), torch.float32, gen).requires_grad_()
        d_o = uniform((64, 4, 32), torch.float32, gen)
        out = hsap.flash_attn_varlen_qkvpacked_func(qkv, cu, 43, causal=True, window_size=(8, 0),
                                                    client=self.client)
        out.backward(d_o)
        ref, _, (grad,) = reference_grads(
            lambda x: flash_varlen_reference(x[:, 0], x[:, 1], x[:, 2], cu, cu, True, (8, 0)),
            (qkv,), d_o)
        self.assertLessEqual(rel_error(out, ref), FP32_TOLERANCE)
        self.assertLessEqual(rel_error(qkv.grad, grad), FP32_TOLERANCE)

        q = uniform((CU_Q[-1], 4, 16), torch.float32, gen).requires_grad_()
        kv = uniform((CU_K[-1], 2, 2, 16), torch.float32, gen).requires_grad_()
        d_o = uniform((CU_Q[-1], 4, 16), torch.float32, gen)
        out, lse, none = hsap.flash_attn_varlen_kvpacked_func(
            q, kv, CU_Q, CU_K, 34, 42, causal=True, return_attn_probs=True, client=self.client)
        out.backward(d_o)
        self.assertIsNone(none)
        ref, ref_lse, (gq, gkv) = reference_grads(
            lambda a, b: flash_varlen_reference(a, b[:, 0], b[:, 1], CU_Q, CU_K, True), (q, kv),
            d_o)
        for got, want in ((out, ref), (lse, ref_lse), (q.grad, gq), (kv.grad, gkv)):
            self.assertLessEqual(rel_error(got, want), FP32_TOLERANCE)

    def test_defaults_outputs_and_determinism(self):
        gen = torch.Generator().manual_seed(6)
        q = uniform((64, 2, 32), torch.float32, gen)
        k = uniform((64, 2, 32), torch.float32, gen)
        t = q.transpose(0, 1).contiguous().transpose(0, 1)  # other strides: copied, accepted
        cu = [0, 30, 64]
        a = hsap.flash_attn_varlen_func(t, k, k, cu, cu, 34, 34, client=self.client)
        b = hsap.flash_attn_varlen_func(q, k, k, cu, cu, 34, 34, deterministic=True,
                                        client=self.client)
        self.assertIsInstance(a, torch.Tensor)  # return_attn_probs=False: out alone
        self.assertTrue(torch.equal(a, b))      # bitwise, whatever the strides
        ref, _ = flash_varlen_reference(q.double(), k.double(), k.double(), cu, cu)  # causal=False
        self.assertLessEqual(rel_error(a, ref), FP32_TOLERANCE)
        # A query row with no key: out 0 and LSE -inf (flash-attention: +inf).
        out, lse, _ = hsap.flash_attn_varlen_func(q[:2], k[:1], k[:1], [0, 2], [0, 1], 2, 1,
                                                  causal=True, return_attn_probs=True,
                                                  client=self.client)
        self.assertTrue(torch.equal(out[0], torch.zeros_like(out[0])))
        self.assertTrue(bool((lse[:, 0] == float("-inf")).all()))
        self.assertTrue(bool(torch.isfinite(lse[:, 1]).all()))

    def test_refused_arguments_name_themselves(self):
        q = torch.zeros(8, 2, 16)
        cu = [0, 8]

        def refused(pieces, fn=hsap.flash_attn_varlen_func, args=None, **kwargs):
            args = args if args is not None else (q, q, q, cu, cu, 8, 8)
            with self.assertRaises(hsap.InvalidInputError) as ctx:
                fn(*args, client=self.client, **kwargs)
            for piece in pieces:
                self.assertIn(piece, str(ctx.exception))

        refused(["dropout_p is 0.1", "no attention dropout", "dropout_p=0.0"], dropout_p=0.1)
        refused(["softcap is 30.0", "softcapping", "softcap=0.0"], softcap=30.0)
        refused(["alibi_slopes is given", "ALiBi", "alibi_slopes=None"],
                alibi_slopes=torch.ones(2))
        refused(["block_table is given", "paged", "block_table=None"],
                block_table=torch.zeros(1, 1, dtype=torch.int32))
        qkv = torch.zeros(8, 3, 2, 16)
        for fn, args in ((hsap.flash_attn_varlen_qkvpacked_func, (qkv, cu, 8)),
                         (hsap.flash_attn_varlen_kvpacked_func, (q, qkv[:, :2], cu, cu, 8, 8))):
            refused(["dropout_p is 0.5"], fn, args, dropout_p=0.5)
            refused(["softcap is 1.0"], fn, args, softcap=1.0)
            refused(["alibi_slopes is given"], fn, args, alibi_slopes=torch.ones(2))
        refused(["qkv has shape [8, 2, 2, 16]", "[total, 3, nheads, headdim]"],
                hsap.flash_attn_varlen_qkvpacked_func, (qkv[:, :2], cu, 8))
        refused(["kv has shape [8, 3, 2, 16]", "[total_k, 2, nheads_k, headdim]"],
                hsap.flash_attn_varlen_kvpacked_func, (q, qkv, cu, cu, 8, 8))
        refused(["max_seqlen_q is 4", "cu_seqlens_q has 8 tokens"], args=(q, q, q, cu, cu, 4, 8))
        refused(["max_seqlen_k is 2", "cu_seqlens_k has 8 tokens"], args=(q, q, q, cu, cu, 8, 2))
        refused(["cu_seqlens_q has 1 documents but cu_seqlens_k has 2"],
                args=(q, q, q, cu, [0, 4, 8], 8, 8))
        refused(["cu_seqlens_k ends at 9 but k has 8 tokens"], args=(q, q, q, cu, [0, 9], 8, 9))
        refused(["window_size is (-2, 0)", ">= -1"], window_size=(-2, 0))
        refused(["window_size is 3", "pair"], window_size=3)
        wide = torch.zeros(8, 2, 257)
        refused(["head_dim (q.shape[2]) is 257", "[1, 256]"], args=(wide, wide, wide, cu, cu, 8, 8))
        # Several ranks: one token space, so the totals of q and k must agree.
        group = hsap.Group("flash-bad", 0, 4, client=self.client)
        refused(["8 query rows but 9 key rows", "one-rank groups only"],
                args=(q, q, q, cu, [0, 9], 8, 9), group=group)
        self.assertEqual(group.call_seq, 0)  # nothing was sent
        # The session is still usable.
        out = hsap.flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, client=self.client)
        self.assertEqual(tuple(out.shape), (8, 2, 16))


if __name__ == "__main__":
    unittest.main(verbosity=2)

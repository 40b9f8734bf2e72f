"""hsap.varlen_attn with one-rank groups: forward output, LSE and gradients
equal a float64 PyTorch reference (fp32 relative error <= 1e-5) for causal,
bidirectional, windowed, GQA and scaled calls with empty and one-token
documents; bf16/fp16 within their rounding; arenas are reused across calls;
the default client and solo group number their calls."""

import unittest

import torch

import hsap
from hsap.reference import varlen_attn_reference

from common import DaemonTestCase, random_qkv, rel_error

FP32_TOLERANCE = 1e-5


class VarlenAttnTest(DaemonTestCase):
    def setUp(self):
        self.client = hsap.connect(self.daemon.socket)

    def tearDown(self):
        self.client.close()

    def check(self, cu, hq, hkv, d, causal=True, window_size=(-1, -1), softmax_scale=None,
              dtype=torch.float32, tolerance=FP32_TOLERANCE, seed=0):
        total = cu[-1]
        q, k, v, d_o = random_qkv(total, hq, hkv, d, dtype, seed)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        max_seqlen = max(cu[i + 1] - cu[i] for i in range(len(cu) - 1))
        out, lse = hsap.varlen_attn(q, k, v, torch.tensor(cu, dtype=torch.int32), max_seqlen,
                                    softmax_scale=softmax_scale, causal=causal,
                                    window_size=window_size, return_lse=True, client=self.client)
        out.backward(d_o)
        self.assertEqual(out.dtype, dtype)
        self.assertEqual(tuple(out.shape), (total, hq, d))
        self.assertEqual(lse.dtype, torch.float32)
        self.assertEqual(tuple(lse.shape), (hq, total))
        self.assertEqual(q.grad.dtype, dtype)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        window_left = window_size[0] if causal else -1
        ref_out, ref_lse = varlen_attn_reference(q64, k64, v64, cu, softmax_scale, causal,
                                                 window_left)
        ref_out.backward(d_o.double())
        for name, got, want in (("out", out, ref_out), ("lse", lse, ref_lse),
                                ("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad),
                                ("dv", v.grad, v64.grad)):
            err = rel_error(got, want)
            self.assertLessEqual(err, tolerance, f"{name}: relative error {err:.3g}")

    def test_causal_documents(self):
        self.check([0, 7, 7, 130, 131, 200, 333], hq=4, hkv=4, d=32)

    def test_grouped_query_heads(self):
        self.check([0, 50, 51, 180], hq=8, hkv=2, d=64, seed=1)

    def test_bidirectional(self):
        self.check([0, 40, 100, 101, 160], hq=4, hkv=1, d=32, causal=False, seed=2)

    def test_sliding_window_and_scale(self):
        self.check([0, 90, 200], hq=2, hkv=2, d=128, window_size=(16, 0), softmax_scale=0.3,
                   seed=3)

    def test_window_zero_sees_only_the_diagonal(self):
        self.check([0, 33, 64], hq=2, hkv=2, d=32, window_size=(0, 0), seed=4)

    def test_bfloat16_and_float16(self):
        # Inputs rounded to 16 bits; the daemon accumulates in fp32 and rounds
        # O and the gradients once more.
        self.check([0, 60, 61, 150], hq=4, hkv=2, d=32, dtype=torch.bfloat16, tolerance=2e-2)
        self.check([0, 60, 61, 150], hq=4, hkv=2, d=32, dtype=torch.float16, tolerance=3e-3)

    def test_only_empty_documents(self):
        q, k, v, _ = random_qkv(0, 2, 2, 32)
        out, lse = hsap.varlen_attn(q, k, v, [0, 0, 0], 0, return_lse=True, client=self.client)
        self.assertEqual(tuple(out.shape), (0, 2, 32))
        self.assertEqual(tuple(lse.shape), (2, 0))

    def test_without_grad_and_list_cu_seqlens(self):
        q, k, v, _ = random_qkv(64, 2, 2, 32)
        out = hsap.varlen_attn(q, k, v, [0, 64], 64, client=self.client)
        self.assertFalse(out.requires_grad)
        ref, _ = varlen_attn_reference(q.double(), k.double(), v.double(), [0, 64])
        self.assertLessEqual(rel_error(out, ref), FP32_TOLERANCE)

    def test_arena_is_reused_and_grown(self):
        for tokens in (64, 64, 64, 3000, 64):
            q, k, v, d_o = random_qkv(tokens, 4, 4, 32)
            q.requires_grad_()
            hsap.varlen_attn(q, k, v, [0, tokens], tokens, client=self.client).backward(d_o)
        regions = self.client.list_regions().regions
        self.assertEqual(len(regions), 1, regions)  # the grown arena replaced the first
        self.assertGreaterEqual(regions[0].size_bytes, 3000 * 4 * 32 * 4 * 9)
        # Ten calls (forward + backward each) of the session's one-rank group.
        self.assertEqual(hsap.groups.solo_group(self.client).call_seq, 10)

    def test_tensors_in_shared_memory_are_not_copied(self):
        cu = [0, 30, 100]
        src_q, src_k, src_v, d_o = random_qkv(100, 4, 2, 32, seed=5)
        q = self.client.empty((100, 4, 32))
        k = self.client.empty((100, 2, 32))
        v = self.client.empty((100, 2, 32))
        for dst, src in ((q, src_q), (k, src_k), (v, src_v)):
            dst.copy_(src).requires_grad_()
        out, lse = hsap.varlen_attn(q, k, v, cu, 70, return_lse=True, client=self.client)
        out.backward(d_o)
        # Copied: only what does not live in shared memory — O, LSE and dO
        # into the backward call.
        self.assertEqual(self.client.copied_bytes, out.numel() * 4 * 2 + lse.numel() * 4)
        q64, k64, v64 = (x.double().requires_grad_() for x in (src_q, src_k, src_v))
        ref_out, ref_lse = varlen_attn_reference(q64, k64, v64, cu)
        ref_out.backward(d_o.double())
        for got, want in ((out, ref_out), (lse, ref_lse), (q.grad, q64.grad), (k.grad, k64.grad),
                          (v.grad, v64.grad)):
            self.assertLessEqual(rel_error(got, want), FP32_TOLERANCE)
        self.assertEqual(len(self.client.list_regions().regions), 4)  # 3 tensors + the arena
        # Once the tensors are gone their regions are unregistered (at the next call).
        del q, k, v, out, lse, dst
        import gc
        gc.collect()
        hsap.varlen_attn(src_q, src_k, src_v, cu, 70, client=self.client)
        self.assertEqual(len(self.client.list_regions().regions), 1)

    def test_module_level_call_uses_the_default_client(self):
        import os
        os.environ["HSAP_SOCKET"] = self.daemon.socket
        q, k, v, _ = random_qkv(40, 2, 2, 32)
        out = hsap.varlen_attn(q, k, v, torch.tensor([0, 10, 40]), 30)
        ref, _ = varlen_attn_reference(q.double(), k.double(), v.double(), [0, 10, 40])
        self.assertLessEqual(rel_error(out, ref), FP32_TOLERANCE)
        self.assertEqual(hsap.default_client().socket_path, self.daemon.socket)
        hsap.default_client().close()
        del os.environ["HSAP_SOCKET"]


if __name__ == "__main__":
    unittest.main(verbosity=2)

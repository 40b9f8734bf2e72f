"""Bad inputs to hsap.varlen_attn / hsap.dispatch / hsap.connect raise
exceptions whose message names the problem: wrong dtypes, cu_seqlens
inconsistent with the tensors, unknown strategies and assignments are caught
in Python (InvalidInputError, a ValueError; dtype
problems InvalidDTypeError, also a TypeError) before anything is sent, and
leave the session usable; what only the daemon checks comes back as
HsapError with its code and message."""

import unittest

import grpc
import torch

import hsap

from common import DaemonTestCase, random_qkv


class BadInputsTest(DaemonTestCase):
    def setUp(self):
        self.client = hsap.connect(self.daemon.socket)
        self.q, self.k, self.v, _ = random_qkv(64, 4, 2, 32)
        self.cu = torch.tensor([0, 20, 64], dtype=torch.int32)

    def tearDown(self):
        self.client.close()

    def call(self, q=None, k=None, v=None, cu=None, max_seqlen=44, **kwargs):
        return hsap.varlen_attn(self.q if q is None else q, self.k if k is None else k,
                                self.v if v is None else v, self.cu if cu is None else cu,
                                max_seqlen, client=self.client, **kwargs)

    def assertRejected(self, error_class, pieces, **call_args):
        with self.assertRaises(error_class) as ctx:
            self.call(**call_args)
        for piece in pieces:
            self.assertIn(piece, str(ctx.exception))
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        return ctx.exception

    def test_wrong_dtypes(self):
        e = self.assertRejected(hsap.InvalidDTypeError, ["q.dtype is torch.float64", "float32"],
                                q=self.q.double(), k=self.k.double(), v=self.v.double())
        self.assertIsInstance(e, TypeError)
        self.assertIsInstance(e, ValueError)
        self.assertRejected(hsap.InvalidDTypeError, ["q.dtype is torch.int32"],
                            q=self.q.int(), k=self.k.int(), v=self.v.int())
        self.assertRejected(hsap.InvalidDTypeError,
                            ["k.dtype is torch.bfloat16 but q.dtype is torch.float32"],
                            k=self.k.bfloat16())
        self.assertRejected(hsap.InvalidDTypeError,
                            ["v.dtype is torch.float16 but q.dtype is torch.float32"],
                            v=self.v.half())
        self.assertRejected(hsap.InvalidDTypeError, ["cu_seqlens.dtype is torch.float32"],
                            cu=self.cu.float())

    def test_non_contiguous_tensors_are_copied(self):
        # flash-attention takes any strides; so does hsap (the arena copy).
        q_t = self.q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
        k_wide = torch.zeros(64, 4, 32)[:, :2]
        k_wide.copy_(self.k)
        self.assertFalse(q_t.is_contiguous() or k_wide.is_contiguous())
        self.assertTrue(torch.equal(self.call(q=q_t, k=k_wide), self.call()))

    def test_cu_seqlens_inconsistent_with_the_tensors(self):
        self.assertRejected(hsap.InvalidInputError, ["cu_seqlens ends at 60", "q has 64 tokens"],
                            cu=[0, 20, 60])
        self.assertRejected(hsap.InvalidInputError, ["cu_seqlens ends at 70", "q has 64 tokens"],
                            cu=[0, 20, 70])
        self.assertRejected(hsap.InvalidInputError, ["cu_seqlens[0] is 5"], cu=[5, 20, 64])
        self.assertRejected(hsap.InvalidInputError, ["cu_seqlens decreases at index 2"],
                            cu=[0, 30, 20, 64])
        self.assertRejected(hsap.InvalidInputError, ["cu_seqlens has shape [1, 3]", "1-D"],
                            cu=self.cu[None])
        self.assertRejected(hsap.InvalidInputError, ["max_seqlen is 10", "longest document",
                                                     "44"], max_seqlen=10)
        # A group of several ranks: the local share cannot exceed the total.
        group = hsap.Group("bad-multi", 0, 4, client=self.client)
        self.assertRejected(hsap.InvalidInputError, ["q has 64 tokens",
                                                     "cu_seqlens covers only 30"],
                            cu=[0, 10, 30], group=group)
        self.assertEqual(group.call_seq, 0)  # nothing was sent

    def test_shapes(self):
        self.assertRejected(hsap.InvalidInputError, ["k has 3 heads but q has 4"],
                            k=torch.zeros(64, 3, 32), v=torch.zeros(64, 3, 32))
        self.assertRejected(hsap.InvalidInputError, ["k.shape is [64, 2, 16]"],
                            k=torch.zeros(64, 2, 16), v=torch.zeros(64, 2, 16))
        self.assertRejected(hsap.InvalidInputError, ["v.shape is [63, 2, 32]"],
                            v=torch.zeros(63, 2, 32))
        self.assertRejected(hsap.InvalidInputError, ["q has shape [64, 128]", "3-D"],
                            q=self.q.reshape(64, 128))

    def test_unknown_strategy_and_options(self):
        self.assertRejected(hsap.InvalidInputError, ["unknown strategy 'fastest'", "auto",
                                                     "hsap"], strategy="fastest")
        self.assertRejected(hsap.InvalidInputError, ["softmax_scale is -1.0"], softmax_scale=-1.0)
        self.assertRejected(hsap.InvalidInputError, ["window_size is (8, -3)", ">= -1"],
                            causal=False, window_size=(8, -3))
        self.assertRejected(hsap.InvalidInputError, ["window_size is 8", "pair"], window_size=8)
        self.assertRejected(hsap.InvalidInputError, ["causal has 3 entries", "2 documents"],
                            causal=[True, False, True])
        self.assertRejected(hsap.InvalidInputError, ["causal[1] is 'sideways'"],
                            causal=[True, "sideways"])
        with self.assertRaises(hsap.InvalidInputError) as ctx:
            hsap.Group("g", 0, 2, assignment="random")
        self.assertIn("unknown assignment 'random'", str(ctx.exception))
        with self.assertRaises(hsap.InvalidInputError) as ctx:
            hsap.Group("g", 2, 2)
        self.assertIn("group rank is 2; it must be in [0, size = 2)", str(ctx.exception))
        with self.assertRaises(hsap.InvalidInputError) as ctx:
            hsap.dispatch([0, 64], 4, 4, 2, 32, strategy="teleport", client=self.client)
        self.assertIn("unknown strategy 'teleport'", str(ctx.exception))

    def test_group_node_lists(self):
        # The old constructor still works and declares no nodes.
        plain = hsap.Group("plain", 1, 2)
        self.assertIsNone(plain.nodes)
        self.assertEqual((plain.node_index, plain.num_nodes), (0, 1))
        g = hsap.Group("declared", 3, 4, nodes=["h:1", "h:2"])
        self.assertEqual((g.nodes, g.node_index, g.num_nodes), (("h:1", "h:2"), 1, 2))
        for kwargs, piece in [
                (dict(rank=0, size=4, nodes=["h:1", "h:1"]), "nodes[1] 'h:1' is the same node"),
                (dict(rank=0, size=3, nodes=["h:1", "h:2"]), "group size 3 is not a multiple"),
                (dict(rank=3, size=4, nodes=["h:1", "h:2"], node_index=0),
                 "node_index is 0 but rank 3 with 2 rank(s) per node is on node 1"),
                (dict(rank=0, size=2, nodes="h:1"), "nodes is 'h:1'"),
                (dict(rank=0, size=2, nodes=[]), "nodes is empty"),
                (dict(rank=0, size=2, node_index=1), "node_index is 1 but nodes is None")]:
            with self.assertRaises(hsap.InvalidInputError) as ctx:
                hsap.Group("g", **kwargs)
            self.assertIn(piece, str(ctx.exception))
        # The list reaches the daemon, which checks it: this one serves no TCP port.
        group = hsap.Group("declared-alone", 0, 1, client=self.client, nodes=["127.0.0.1:1"])
        with self.assertRaises(hsap.HsapError) as ctx:
            self.call(group=group)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("call.nodes names 1 node(s) but this daemon has no TCP address",
                      ctx.exception.message)

    def test_rejected_calls_leave_the_session_usable(self):
        for _ in range(3):
            with self.assertRaises(hsap.InvalidInputError):
                self.call(strategy="nope")
        out = self.call()
        self.assertEqual(tuple(out.shape), (64, 4, 32))
        self.assertEqual(hsap.groups.solo_group(self.client).call_seq, 1)

    def test_daemon_errors_keep_code_and_message(self):
        # 1025 heads pass the Python checks; the daemon names its limit.
        q, k, v, _ = random_qkv(1, 1025, 1, 1)
        with self.assertRaises(hsap.HsapError) as ctx:
            self.call(q=q, k=k, v=v, cu=[0, 1], max_seqlen=1)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("q.shape[1] (Hq) is 1025", ctx.exception.message)
        # The one-rank group is renewed after a daemon error: the next call works.
        self.assertEqual(tuple(self.call().shape), (64, 4, 32))
        with self.assertRaises(hsap.HsapError) as ctx:
            hsap.dispatch([0, 64], 4, 3, 2, 32, client=self.client)
        self.assertEqual(ctx.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_connect_without_a_daemon(self):
        with self.assertRaises(hsap.HsapError) as ctx:
            hsap.connect(self.daemon.dir + "/nobody.sock")
        self.assertEqual(ctx.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("nobody.sock.session", ctx.exception.message)


if __name__ == "__main__":
    unittest.main(verbosity=2)

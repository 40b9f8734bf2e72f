"""hsap.nn.ContextParallelAttention in training: 4 processes (gloo on a
FileStore) against 2 hsapd on loopback (2 CPU slots each), one group over
both daemons formed at run time, pg ranks alternating between them.

A two-layer model (per layer: q, k, v projections with GQA, the module,
an output projection, a residual) is trained for one step of two
micro-batches of gradient accumulation (two packs with different
documents, each sharded with hsap.shard), three ways:

* plain autograd;
* every layer under torch.utils.checkpoint (use_reentrant=True: forward
  without a graph, recomputed in backward);
* use_reentrant=False (recomputed when the saved tensors are unpacked).

Each way, the parameter gradients summed over the ranks equal those of the
same model in float64 on the whole packs with dense masked attention
(fp32 relative error <= 1e-5 per parameter), and each rank made exactly the
attention calls expected: per micro-batch and layer one forward and one
backward, plus one recomputed forward under checkpoint.
"""

import multiprocessing
import os
import socket
import tempfile
import traceback
import unittest

import torch
import torch.utils.checkpoint

import hsap
from hsap.daemon import LocalDaemon
from hsap.reference import varlen_attn_reference

from common import rel_error

WORLD = 4
C, HQ, HKV, D = 24, 4, 2, 32
LAYERS = 2
PACKS = [[0, 1, 150, 151, 333], [0, 200, 201, 201, 290]]  # micro-batches: documents
TOLERANCE = 1e-5
TIMEOUT_S = 150


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Layer(torch.nn.Module):
    """x [T, C] -> x + Wo(attention(Wq x, Wk x, Wv x)); `attend(q, k, v)`
    is the attention: the hsap module on a rank, dense on the reference."""

    def __init__(self):
        super().__init__()
        self.wq = torch.nn.Linear(C, HQ * D, bias=False)
        self.wk = torch.nn.Linear(C, HKV * D, bias=False)
        self.wv = torch.nn.Linear(C, HKV * D, bias=False)
        self.wo = torch.nn.Linear(HQ * D, C, bias=False)

    def forward(self, x, attend):
        t = x.shape[0]
        q = self.wq(x).view(t, HQ, D)
        k = self.wk(x).view(t, HKV, D)
        v = self.wv(x).view(t, HKV, D)
        return x + self.wo(attend(q, k, v).reshape(t, HQ * D))


def make_model():
    torch.manual_seed(0)
    return torch.nn.ModuleList(Layer() for _ in range(LAYERS))


def pack_data(i):
    """(x [T, C], target [T, C]) of micro-batch i, the same on every rank."""
    g = torch.Generator().manual_seed(100 + i)
    t = PACKS[i][-1]
    return torch.randn(t, C, generator=g), torch.randn(t, C, generator=g)


def reference_grads():
    """{parameter name: gradient} of the float64 model on the whole packs."""
    model = make_model().double()
    total = sum(p[-1] for p in PACKS)
    for i, cu in enumerate(PACKS):
        x, target = (a.double() for a in pack_data(i))
        for layer in model:
            x = layer(x, lambda q, k, v, cu=cu: varlen_attn_reference(q, k, v, cu)[0])
        ((x * target).sum() / total).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def train_step(group, mode):
    """One step of two micro-batches on this rank; returns (gradients summed
    over the ranks, this rank's attention calls)."""
    import torch.distributed as dist
    model = make_model()
    attn = hsap.nn.ContextParallelAttention(group, causal=True)
    total = sum(p[-1] for p in PACKS)
    calls_before = group.call_seq
    for i, cu in enumerate(PACKS):
        x, target = pack_data(i)
        (x_local, target_local), sharding = hsap.shard([x, target], cu, group, heads=HQ,
                                                       kv_heads=HKV, head_dim=D)
        h = x_local.requires_grad_()
        for layer in model:
            def run(h, layer=layer, sharding=sharding):
                return layer(h, lambda q, k, v: attn(q, k, v, sharding))
            if mode == "plain":
                h = run(h)
            else:
                h = torch.utils.checkpoint.checkpoint(run, h,
                                                      use_reentrant=(mode == "reentrant"))
        ((h * target_local).sum() / total).backward()  # accumulates into .grad
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    for g in grads.values():
        dist.all_reduce(g)
    return grads, group.call_seq - calls_before


def worker(rank, store_path, sockets, queue):
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank,
                                world_size=WORLD)
        client = hsap.connect(sockets[rank % 2])
        group = hsap.Group.from_process_group(client=client)
        reference = reference_grads() if rank == 0 else None
        result = {"rank": group.rank}
        for mode in ("plain", "reentrant", "non_reentrant"):
            grads, calls = train_step(group, mode)
            result[mode] = {"calls": calls}
            if reference is not None:
                result[mode]["errors"] = {n: rel_error(g, reference[n]) for n, g in grads.items()}
        client.close()
        queue.put((rank, result))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: B036 - reported to the test
        queue.put((rank, traceback.format_exc()))


class ContextParallelAttentionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ports = [free_port(), free_port()]
        flags = ["--cpu_threads=1", "--ucx_transports=tcp", "--insecure_peers",
                 "--heartbeat_ms=100",
                 "--call_deadline_ms=30000", "--host=127.0.0.1"]
        cls.daemons = []
        try:
            for port in ports:
                cls.daemons.append(LocalDaemon(devices="cpu:2", flags=flags + [f"--port={port}"]))
            cls.results = cls.run_workers()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.stop()

    @classmethod
    def run_workers(cls):
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory(prefix="hsap-nn-") as tmp:
            args = (os.path.join(tmp, "store"), [d.socket for d in cls.daemons], queue)
            procs = [ctx.Process(target=worker, args=(r, *args)) for r in range(WORLD)]
            for p in procs:
                p.start()
            results = {}
            try:
                for _ in range(WORLD):
                    rank, result = queue.get(timeout=TIMEOUT_S)
                    if isinstance(result, str):
                        raise AssertionError(f"process {rank} failed:\n{result}")
                    results[rank] = result
            finally:
                for p in procs:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        p.join()
        return [results[r] for r in range(WORLD)]

    def check(self, mode, calls_per_layer):
        want_calls = len(PACKS) * LAYERS * calls_per_layer
        for r in self.results:
            self.assertEqual(r[mode]["calls"], want_calls, f"pg rank {r['rank']}")
        errors = self.results[0][mode]["errors"]
        self.assertEqual(len(errors), LAYERS * 4)
        for name, err in errors.items():
            self.assertLessEqual(err, TOLERANCE, f"{mode}: {name}")
        listing = ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
        print(f"  {mode}: {want_calls} attention calls per rank, max gradient rel error "
              f"{max(errors.values()):.2g} ({listing})")

    def test_two_micro_batches(self):
        self.check("plain", 2)

    def test_checkpoint_reentrant(self):
        self.check("reentrant", 3)

    def test_checkpoint_non_reentrant(self):
        self.check("non_reentrant", 3)


class LocalChecksTest(unittest.TestCase):
    def test_the_module_needs_a_group_and_a_sharding(self):
        with self.assertRaisesRegex(hsap.InvalidInputError, "it must be an hsap.Group"):
            hsap.nn.ContextParallelAttention("not a group")
        group = hsap.Group("g", 0, 1)
        attn = hsap.nn.ContextParallelAttention(group)
        q = torch.zeros(4, 2, 8)
        with self.assertRaisesRegex(hsap.InvalidInputError, "pass the Sharding hsap.shard"):
            attn(q, q, q, [0, 4])
        with self.assertRaisesRegex(hsap.InvalidInputError, "softmax_scale is -1"):
            hsap.nn.ContextParallelAttention(group, softmax_scale=-1)
        with self.assertRaisesRegex(hsap.InvalidInputError, "unknown strategy 'fast'"):
            hsap.nn.ContextParallelAttention(group, strategy="fast")


if __name__ == "__main__":
    unittest.main(verbosity=2)

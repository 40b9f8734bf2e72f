"""hsap.shard / hsap.unshard / hsap.nn.ContextParallelAttention across
processes: 4 processes (gloo on a FileStore) and 3 hsapd on loopback (two
of 2 CPU slots that also form a static cluster, one of 3). Groups:

* alternate: WORLD with pg ranks alternating between the daemons (hsap
  ranks 0, 2, 1, 3: not node-major), formed at run time over both nodes;
* odd: pg ranks 1, 2, 3 on the third daemon with their device slots
  reversed (a 3-rank group, hsap ranks 2, 1, 0 for sub-pg ranks 0, 1, 2);
* solo: pg rank 0 alone (a one-rank group).

For each, a pack with documents of length 0, 1 and longer than a rank's
share: shard of 1-D int64 ids / positions / labels, 2-D and 3-D float32,
bfloat16 and bool tensors (alone, in a tuple, in a dict) gives every rank
its dispatch rows, unshard puts them back bit for bit; position_ids are the
in-document positions; the ranks' rows partition the pack and the long
document spans several ranks. The layout is the daemon's: the module's
forward output, LSE-free gradients and the unsharded output equal the float64
reference (fp32 relative error <= 1e-5), and the plan the daemon ran
(CallStats.plan_key) is the sharding's. unshard's backward all-reduces
(every rank's w-weighted sum gives P * w on each row).

Refusals (no call made, the group's call numbering unchanged): rows of
another sharding, a module of another group, a module whose mask lays
tokens out differently (causal=False, a window: InvalidInputError naming
the field and both layouts); a call that differs only in what does not move
tokens (strategy, heads) is checked with one Plans.Dispatch and runs. A
group without a node list spanning the static cluster plans over 2 nodes
while dispatch was told 1: the output is either correct or refused (never
wrong), and a sharding whose recorded layout is not the plan's is refused
after the call (FAILED_PRECONDITION). What the daemon itself does with a
wrong row count: INVALID_ARGUMENT naming the rank's share.
"""

import multiprocessing
import os
import socket
import tempfile
import time
import traceback
import unittest

import torch

import hsap
from hsap.daemon import LocalDaemon
from hsap.reference import varlen_attn_reference

from common import random_qkv, rel_error

WORLD = 4
HQ, HKV, D = 4, 2, 32
# Documents of 1, 1, 148, 0, 1, 1, 148, 0 and 33 tokens: 148 is more than a
# rank's share at 3 and 4 ranks (111, 83).
CU = [0, 1, 2, 150, 150, 151, 152, 300, 300, 333]
T = CU[-1]
TOLERANCE = 1e-5
TIMEOUT_S = 150


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def global_tensors():
    """The pack's tensors, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (T,), generator=g)
    return {
        "ids": ids,
        "labels": torch.roll(ids, -1),
        "hidden2": torch.randn(T, 16, generator=g),
        "hidden3": torch.randn(T, 3, 8, generator=g),
        "half": torch.randn(T, 5, generator=g).to(torch.bfloat16),
        "mask": torch.rand(T, generator=g) > 0.5,
    }


def reference_positions():
    pos = torch.empty(T, dtype=torch.int64)
    for a, b in zip(CU[:-1], CU[1:]):
        pos[a:b] = torch.arange(b - a)
    return pos


def expect(fn, error=hsap.HsapError):
    try:
        fn()
    except error as e:
        return {"error": type(e).__name__, "code": e.code.name, "message": e.message}
    return {"error": None}


def check_group(group):
    """Everything measured on this rank for one group."""
    result = {"rank": group.rank, "size": group.size}
    tensors = global_tensors()
    local, sharding = hsap.shard(tensors, CU, group, heads=HQ, kv_heads=HKV, head_dim=D)
    rows = sharding.indices
    result["rows"] = rows.tolist()
    result["ranges"] = sharding.dispatch.ranges
    result["local_equal"] = all(torch.equal(local[n], t[rows]) for n, t in tensors.items())
    result["dtypes_kept"] = all(local[n].dtype == t.dtype for n, t in tensors.items())
    back = hsap.unshard(local, sharding)
    result["round_trip"] = {n: torch.equal(back[n], t) for n, t in tensors.items()}
    one, one_sharding = hsap.shard(tensors["ids"], CU, group, heads=HQ, kv_heads=HKV, head_dim=D)
    pair = hsap.unshard((one, None), one_sharding)
    result["single_and_tuple"] = (isinstance(pair, tuple) and pair[1] is None
                                  and torch.equal(pair[0], tensors["ids"]))
    result["positions"] = torch.equal(sharding.position_ids, reference_positions()[rows])

    # Attention through the module: the daemon's layout is the sharding's.
    q, k, v, d_o = random_qkv(T, HQ, HKV, D, seed=3)
    x64 = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, _ = varlen_attn_reference(*x64, CU)
    ref_out.backward(d_o.double())
    (ql, kl, vl, dol), qkv_sharding = hsap.shard([q, k, v, d_o], CU, group, heads=HQ,
                                                 kv_heads=HKV, head_dim=D)
    ql, kl, vl = (x.requires_grad_() for x in (ql, kl, vl))
    attn = hsap.nn.ContextParallelAttention(group, causal=True)
    out = attn(ql, kl, vl, qkv_sharding)
    ran = group.last_stats.plan_key
    result["same_plan_key"] = ran == qkv_sharding.plan_key
    result["ran_layout_match"] = (hsap.plans.plan_layout(ran, group.client).layout_hash
                                  == qkv_sharding.layout_hash)
    out.backward(dol)
    result["errors"] = {"out": rel_error(out, ref_out[rows]),
                        "dq": rel_error(ql.grad, x64[0].grad[rows]),
                        "dk": rel_error(kl.grad, x64[1].grad[rows]),
                        "dv": rel_error(vl.grad, x64[2].grad[rows]),
                        "unsharded": rel_error(hsap.unshard(out.detach(), qkv_sharding),
                                               ref_out)}

    # unshard's backward: every rank's sum(w * global) -> P * w on its rows.
    w = torch.randn(T, 16, generator=torch.Generator().manual_seed(9))
    x = local["hidden2"].clone().requires_grad_()
    (hsap.unshard(x, sharding) * w).sum().backward()
    result["unshard_grad"] = torch.equal(x.grad, group.size * w[rows])

    # Refusals before anything is sent: the call numbering does not move.
    seq = group.call_seq
    other_cu = CU[:-1] + [T + 7]
    (oq, okv), other = hsap.shard([torch.zeros(T + 7, HQ, D), torch.zeros(T + 7, HKV, D)],
                                  other_cu, group, heads=HQ, kv_heads=HKV, head_dim=D)
    if other.local_tokens != sharding.local_tokens:
        result["other_rows"] = expect(lambda: attn(oq, okv, okv, qkv_sharding))
    else:
        result["other_rows"] = {"error": "same count", "message": ""}
    stranger = hsap.Group(group.name + "-x", group.rank, group.size, client=group.client,
                          nodes=group.nodes)
    result["other_group"] = expect(
        lambda: hsap.nn.ContextParallelAttention(stranger)(ql, kl, vl, qkv_sharding))
    if group.size > 1:  # (one rank's layout is every token, whatever the mask)
        result["full_mask"] = expect(lambda: hsap.nn.ContextParallelAttention(
            group, causal=False)(ql, kl, vl, qkv_sharding))
        result["window"] = expect(lambda: hsap.nn.ContextParallelAttention(
            group, window_size=(16, 0))(ql, kl, vl, qkv_sharding))
    result["bad_leading_dim"] = expect(
        lambda: hsap.shard([tensors["ids"], tensors["ids"][:-1]], CU, group, heads=HQ,
                           head_dim=D))
    result["bad_unshard_rows"] = expect(lambda: hsap.unshard(local["ids"][:-1], sharding))
    result["seq_unchanged"] = group.call_seq == seq

    # What does not move tokens runs (after one Plans.Dispatch): ring, 8 heads.
    ring = hsap.nn.ContextParallelAttention(group, strategy="ring")
    result["ring_error"] = rel_error(ring(ql.detach(), kl.detach(), vl.detach(), qkv_sharding),
                                     ref_out[rows])
    q8 = ql.detach().repeat(1, 2, 1)
    k8 = kl.detach().repeat(1, 2, 1)
    v8 = vl.detach().repeat(1, 2, 1)
    ref8 = varlen_attn_reference(q.double().repeat(1, 2, 1), k.double().repeat(1, 2, 1),
                                 v.double().repeat(1, 2, 1), CU)[0]
    result["heads8_error"] = rel_error(attn(q8, k8, v8, qkv_sharding), ref8[rows])
    return result


def static_cluster(rank, sockets):
    """A group without a node list over the static cluster (ranks 0, 1 on
    daemon 0, 2, 3 on daemon 1): hsap.dispatch is told 1 node, the calls plan
    over 2. Returns what happened: correct output, or refused."""
    client = hsap.connect(sockets[rank // 2])
    try:
        group = hsap.Group("static-cluster", rank, WORLD, client=client)
        q, k, v, _ = random_qkv(T, HQ, HKV, D, seed=4)
        ref = varlen_attn_reference(q.double(), k.double(), v.double(), CU)[0]
        (ql, kl, vl), sharding = hsap.shard([q, k, v], CU, group, heads=HQ, kv_heads=HKV,
                                            head_dim=D)
        attn = hsap.nn.ContextParallelAttention(group)
        try:
            out = attn(ql, kl, vl, sharding)
            outcome = {"error": None, "rel": rel_error(out, ref[sharding.indices])}
        except hsap.HsapError as e:
            outcome = {"error": e.code.name, "message": e.message}
        outcome["ran_other_plan"] = (group.last_stats is not None
                                     and group.last_stats.plan_key != sharding.plan_key)
        # A sharding whose recorded layout is not the one of the plans that
        # ran (as if hsap.dispatch had answered another layout): refused
        # after the call, on every rank.
        (ql, kl, vl), tampered = hsap.shard([q, k, v], CU, group, heads=HQ, kv_heads=HKV,
                                            head_dim=D)
        tampered.layout_hash = "0" * 32
        tampered.plan_key = "f" * 32
        tampered._verified = {key: "f" * 32 for key in tampered._verified}
        fresh = hsap.Group("static-cluster-2", rank, WORLD, client=client)
        tampered.group = fresh
        outcome["tampered"] = expect(
            lambda: hsap.nn.ContextParallelAttention(fresh)(ql, kl, vl, tampered))
        return outcome
    finally:
        client.close()


def daemon_row_check(rank, sockets):
    """A raw varlen_attn with one row too many on rank 0: what the daemon says."""
    import torch.distributed as dist
    client = hsap.connect(sockets[rank % 2])
    try:
        group = hsap.Group.from_process_group(client=client, deadline_ms=3000)
        q, k, v, _ = random_qkv(T, HQ, HKV, D, seed=4)
        layout = hsap.dispatch(CU, heads=HQ, kv_heads=HKV, head_dim=D, group=group)
        rows = layout.indices()
        if group.rank == 0:
            rows = torch.cat([rows, rows[:1]])
        got = expect(lambda: hsap.varlen_attn(q[rows], k[rows], v[rows], CU, 148, group=group))
        dist.barrier()
        return dict(got, rank=group.rank)
    finally:
        client.close()


def scenarios(rank, sockets):
    import torch.distributed as dist
    results = {}
    client = hsap.connect(sockets[rank % 2])
    group = hsap.Group.from_process_group(client=client)
    results["alternate"] = check_group(group)
    client.close()

    odd = dist.new_group([1, 2, 3])
    solo = dist.new_group([0])
    if rank in (1, 2, 3):
        client = hsap.connect(sockets[2])
        group = hsap.Group.from_process_group(odd, client=client, local_slot=3 - rank)
        results["odd"] = check_group(group)
        client.close()
    if rank == 0:
        client = hsap.connect(sockets[0])
        group = hsap.Group.from_process_group(solo, client=client)
        results["solo"] = check_group(group)
        client.close()
    dist.barrier()
    results["static"] = static_cluster(rank, sockets)
    dist.barrier()
    results["daemon_rows"] = daemon_row_check(rank, sockets)
    return results


def worker(rank, store_path, sockets, queue):
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank,
                                world_size=WORLD)
        queue.put((rank, scenarios(rank, sockets)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: B036 - reported to the test
        queue.put((rank, traceback.format_exc()))


class ShardingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ports = [free_port(), free_port(), free_port()]
        addresses = [f"127.0.0.1:{p}" for p in ports[:2]]
        flags = ["--cpu_threads=1", "--ucx_transports=tcp", "--insecure_peers",
                 "--heartbeat_ms=100",
                 "--call_deadline_ms=30000", f"--peers={','.join(addresses)}"]
        cls.daemons = []
        try:
            for i, port in enumerate(ports[:2]):
                cls.daemons.append(LocalDaemon(devices="cpu:2", flags=flags + [
                    f"--port={port}", f"--node_rank={i}"]))
            cls.daemons.append(LocalDaemon(devices="cpu:3", flags=flags[:5] + [
                "--host=127.0.0.1", f"--port={ports[2]}"]))
            cls.wait_formed()
            cls.results = cls.run_workers()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.stop()

    @classmethod
    def wait_formed(cls):
        deadline = time.monotonic() + 30
        for d in cls.daemons[:2]:
            with hsap.connect(d.socket) as c:
                while not c.cluster_status().formed:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the cluster did not form:\n{d.log()[-3000:]}")
                    time.sleep(0.05)

    @classmethod
    def run_workers(cls):
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory(prefix="hsap-shard-") as tmp:
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

    def group_results(self, scenario):
        return [r[scenario] for r in self.results if scenario in r]

    def check_scenario(self, scenario, want_ranks):
        got = self.group_results(scenario)
        self.assertEqual([g["rank"] for g in got], want_ranks)
        size = len(got)
        covered = sorted(t for g in got for t in g["rows"])
        self.assertEqual(covered, list(range(T)), "the ranks' rows partition the pack")
        for g in got:
            self.assertEqual(g["size"], size)
            self.assertTrue(g["local_equal"])
            self.assertTrue(g["dtypes_kept"])
            self.assertEqual(g["round_trip"], {n: True for n in g["round_trip"]})
            self.assertTrue(g["single_and_tuple"])
            self.assertTrue(g["positions"])
            self.assertTrue(g["ran_layout_match"])
            self.assertTrue(g["unshard_grad"])
            for what, err in g["errors"].items():
                self.assertLessEqual(err, TOLERANCE, f"{scenario} rank {g['rank']} {what}")
            self.assertLessEqual(g["ring_error"], TOLERANCE)
            self.assertLessEqual(g["heads8_error"], TOLERANCE)
        if size > 1:  # the 148-token documents span several ranks
            for begin, end in ((2, 150), (152, 300)):
                owners = {g["rank"] for g in got for b, e in g["ranges"][g["rank"]]
                          if b < end and e > begin}
                self.assertGreater(len(owners), 1, f"document [{begin}, {end}) on one rank")
        worst = max(max(g["errors"].values()) for g in got)
        print(f"  {scenario}: {size} rank(s), hsap ranks by pg rank {want_ranks}, rows "
              f"{[len(g['rows']) for g in got]}, max rel error {worst:.2g}, the plan that ran: "
              f"{'the' if got[0]['same_plan_key'] else 'not the'} dispatch's plan key, its "
              "layout the sharding's")
        return got

    def test_alternating_pg_ranks(self):
        self.check_scenario("alternate", [0, 2, 1, 3])

    def test_odd_world_size_with_reversed_slots(self):
        self.check_scenario("odd", [2, 1, 0])

    def test_one_rank(self):
        self.check_scenario("solo", [0])

    def test_refusals_name_the_difference(self):
        for scenario in ("alternate", "odd", "solo"):
            for g in self.group_results(scenario):
                with self.subTest(scenario=scenario, rank=g["rank"]):
                    self.assertTrue(g["seq_unchanged"])
                    e = g["other_rows"]
                    if e["error"] != "same count":
                        self.assertEqual(e["error"], "InvalidInputError")
                        self.assertIn("pass the rows of this sharding", e["message"])
                    self.assertEqual(g["other_group"]["error"], "InvalidInputError")
                    self.assertIn("the sharding was made for Group(", g["other_group"]["message"])
                    if g["size"] > 1:
                        e = g["full_mask"]
                        self.assertEqual(e["error"], "InvalidInputError")
                        self.assertIn("causal False (sharded with True)", e["message"])
                        self.assertIn("computing it would attend the wrong tokens", e["message"])
                        e = g["window"]
                        self.assertEqual(e["error"], "InvalidInputError")
                        self.assertIn("window_size (16, 0) (sharded with (-1, -1))", e["message"])
                    e = g["bad_leading_dim"]
                    self.assertEqual(e["error"], "InvalidInputError")
                    self.assertIn("tensors[1] has 332 rows but cu_seqlens ends at 333",
                                  e["message"])
                    self.assertIn("local has", g["bad_unshard_rows"]["message"])

    def test_static_cluster_is_correct_or_refused(self):
        for rank, r in enumerate(self.results):
            got = r["static"]
            print(f"  static cluster, pg rank {rank}: {got}")
            if got["error"] is None:
                self.assertLessEqual(got["rel"], TOLERANCE, f"rank {rank}")
            else:
                self.assertEqual(got["error"], "FAILED_PRECONDITION")
            e = got["tampered"]
            self.assertEqual(e["code"], "FAILED_PRECONDITION", f"rank {rank}: {e}")
            self.assertIn("its output was dropped", e["message"])
        first = self.results[0]["static"]
        print(f"  static cluster: ran another plan than dispatch's: {first['ran_other_plan']}; "
              f"{'refused' if first['error'] else 'correct, rel error %.2g' % first['rel']}")

    def test_the_daemon_refuses_a_wrong_row_count(self):
        by_rank = {r["daemon_rows"]["rank"]: r["daemon_rows"] for r in self.results}
        self.assertEqual(by_rank[0]["code"], "INVALID_ARGUMENT")
        self.assertIn("the plan's dispatch gives rank 0 of 4", by_rank[0]["message"])
        for rank in (1, 2, 3):
            self.assertIn(by_rank[rank]["code"], ("DEADLINE_EXCEEDED", "ABORTED"))


if __name__ == "__main__":
    unittest.main(verbosity=2)

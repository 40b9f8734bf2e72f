"""hsap.Group.from_process_group and hsap.init_from_env: 4 processes (a gloo
process group on a FileStore) against 2 hsapd daemons that form a static
cluster on loopback (2 CPU slots each). Every process holds only its
hsap.dispatch tokens; its forward output, LSE and gradients equal the rows of
the float64 reference (fp32 relative error <= 1e-5) when

* the pg ranks alternate between the daemons (pg 0, 2 on node 0; 1, 3 on
  node 1; no $HSAP_ADDRESS, no $LOCAL_RANK: addresses from the daemons): the
  hsap ranks are node-major, 0, 2, 1, 3 for pg ranks 0, 1, 2, 3;
* init_from_env under a torchrun-like environment with $HSAP_ADDRESS and
  $LOCAL_RANK reversed on each node: hsap ranks 1, 0, 3, 2.

Every formation with name=None gets a new name, the same on every rank. Bad
declarations raise the same error on every rank instead of hanging: unequal
ranks per node (the counts listed), one rank's bad $HSAP_ADDRESS, different
names, a daemon without a TCP address, one rank without a daemon.
init_from_env names the environment variable it cannot use."""

import multiprocessing
import os
import socket
import tempfile
import traceback
import unittest
from unittest import mock

import torch

import hsap
from hsap.daemon import LocalDaemon
from hsap.distributed import plan_group
from hsap.reference import varlen_attn_reference

from common import random_qkv, rel_error

WORLD = 4
HQ, HKV, D = 4, 2, 32
CU = [0, 7, 7, 130, 131, 200, 333]
MAX_SEQLEN = 133
TOLERANCE = 1e-5
TIMEOUT_S = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def attention_errors(group, strategy):
    """Forward + backward of this rank's dispatch rows; the max relative
    error of each result against the rows of the float64 reference."""
    q, k, v, d_o = random_qkv(CU[-1], HQ, HKV, D, seed=11)
    x64 = [x.double().requires_grad_() for x in (q, k, v)]
    ref_out, ref_lse = varlen_attn_reference(*x64, CU)
    ref_out.backward(d_o.double())
    layout = hsap.dispatch(CU, group.size, HQ, HKV, D, torch.float32, strategy,
                           group.assignment, nodes=group.num_nodes, client=group.client)
    rows = layout.indices(group.rank)
    local = [x[rows].clone().requires_grad_() for x in (q, k, v)]
    out, lse = hsap.varlen_attn(*local, CU, MAX_SEQLEN, group=group, strategy=strategy,
                                return_lse=True)
    out.backward(d_o[rows])
    return {"out": rel_error(out, ref_out[rows]), "lse": rel_error(lse, ref_lse[:, rows]),
            "dq": rel_error(local[0].grad, x64[0].grad[rows]),
            "dk": rel_error(local[1].grad, x64[1].grad[rows]),
            "dv": rel_error(local[2].grad, x64[2].grad[rows]), "rows": len(rows),
            "strategy": layout.strategy}


def describe(group):
    return {"rank": group.rank, "pg_rank": group.pg_rank, "pg_ranks": group.pg_ranks,
            "nodes": group.nodes, "node_index": group.node_index,
            "local_rank": group.local_rank, "name": group.name}


def expect_error(fn):
    try:
        fn()
    except hsap.HsapError as e:
        return {"error": type(e).__name__, "code": e.code.name, "message": e.message}
    return {"error": None}


def scenarios(rank, sockets, addresses, portless_socket, store_port):
    """Runs every scenario in this process; returns {scenario: result}."""
    import torch.distributed as dist
    results = {}
    env = os.environ

    # 1. Alternating pg ranks, addresses asked from the daemons.
    client = hsap.connect(sockets[rank % 2])
    group = hsap.Group.from_process_group(client=client)
    results["alternate"] = dict(describe(group), errors=attention_errors(group, "hsap"))
    again = hsap.Group.from_process_group(client=client)
    results["alternate_again"] = dict(describe(again), errors=attention_errors(again, "ring"))

    # 2. init_from_env with torchrun's variables, LOCAL_RANK reversed.
    env.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(1 - rank % 2),
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port),
               HSAP_SOCKET=sockets[rank // 2], HSAP_ADDRESS=addresses[rank // 2])
    group = hsap.init_from_env(name="pg-test-given")
    results["from_env"] = dict(describe(group), errors=attention_errors(group, "auto"))
    group.client.close()

    # 3. Unequal ranks per node: 3 on node 0, 1 on node 1.
    env["HSAP_ADDRESS"] = addresses[0 if rank < 3 else 1]
    del env["LOCAL_RANK"]
    results["unequal"] = expect_error(lambda: hsap.Group.from_process_group(client=client))

    # 4. One rank's bad address: every rank raises.
    env["HSAP_ADDRESS"] = "nonsense" if rank == 2 else addresses[rank // 2]
    results["bad_address"] = expect_error(lambda: hsap.Group.from_process_group(client=client))

    # 5. Different names.
    env["HSAP_ADDRESS"] = addresses[rank // 2]
    results["names"] = expect_error(lambda: hsap.Group.from_process_group(
        name="a" if rank == 0 else "b", client=client))

    # 6. No $HSAP_ADDRESS and a daemon without --port.
    del env["HSAP_ADDRESS"]
    portless = hsap.connect(portless_socket)
    results["no_address"] = expect_error(lambda: hsap.Group.from_process_group(client=portless))
    portless.close()

    # 7. init_from_env where one rank finds no daemon.
    env.update(LOCAL_RANK=str(rank % 2), HSAP_SOCKET="/nonexistent/hsapd.sock" if rank == 1
               else sockets[rank // 2], HSAP_ADDRESS=addresses[rank // 2])
    results["no_daemon"] = expect_error(hsap.init_from_env)
    client.close()
    dist.barrier()
    return results


def worker(rank, store_path, sockets, addresses, portless_socket, store_port, queue):
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD), rank=rank,
                                world_size=WORLD)
        queue.put((rank, scenarios(rank, sockets, addresses, portless_socket, store_port)))
        dist.destroy_process_group()
    except BaseException:  # noqa: B036 - reported to the test
        queue.put((rank, traceback.format_exc()))


class ProcessGroupTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ports = [free_port(), free_port()]
        cls.addresses = [f"127.0.0.1:{p}" for p in ports]
        flags = ["--cpu_threads=1", "--ucx_transports=tcp", "--insecure_peers",
                 "--heartbeat_ms=100",
                 "--call_deadline_ms=30000", f"--peers={','.join(cls.addresses)}"]
        cls.daemons = []
        try:
            for i, port in enumerate(ports):
                cls.daemons.append(LocalDaemon(devices="cpu:2",
                                               flags=flags + [f"--port={port}", f"--node_rank={i}"]))
            cls.daemons.append(LocalDaemon(devices="cpu:2", flags=["--cpu_threads=1"]))
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
        import time
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
        with tempfile.TemporaryDirectory(prefix="hsap-pg-") as tmp:
            args = (os.path.join(tmp, "store"), [d.socket for d in cls.daemons[:2]],
                    cls.addresses, cls.daemons[2].socket, free_port(), queue)
            procs = [ctx.Process(target=worker, args=(r, *args)) for r in range(WORLD)]
            for p in procs:
                p.start()
            results = {}
            try:
                for _ in range(WORLD):
                    rank, result = queue.get(timeout=TIMEOUT_S)
                    if isinstance(result, str):
                        raise AssertionError(f"rank {rank} failed:\n{result}")
                    results[rank] = result
            finally:
                for p in procs:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        p.join()
        return [results[r] for r in range(WORLD)]

    def check_group(self, scenario, want_ranks, strategy=None):
        got = [r[scenario] for r in self.results]
        self.assertEqual([g["rank"] for g in got], want_ranks)
        self.assertEqual([g["pg_rank"] for g in got], list(range(WORLD)))
        pg_of = [want_ranks.index(r) for r in range(WORLD)]
        for g in got:
            self.assertEqual(list(g["nodes"]), self.addresses)
            self.assertEqual(list(g["pg_ranks"]), pg_of)
            self.assertEqual(g["node_index"], g["rank"] // 2)
            self.assertEqual(g["local_rank"], g["rank"] % 2)
            self.assertEqual(g["name"], got[0]["name"])
            self.assertGreater(g["errors"]["rows"], 0)
            if strategy is not None:
                self.assertEqual(g["errors"]["strategy"], strategy)
            for what in ("out", "lse", "dq", "dk", "dv"):
                err = g["errors"][what]
                self.assertLessEqual(err, TOLERANCE, f"{scenario} rank {g['rank']} {what}: {err}")
        worst = {w: max(g["errors"][w] for g in got) for w in ("out", "lse", "dq", "dk", "dv")}
        print(f"  {scenario}: hsap ranks {want_ranks}, strategy {got[0]['errors']['strategy']}, "
              f"max rel error {', '.join(f'{w} {e:.2g}' for w, e in worst.items())}")
        return got[0]["name"]

    def test_alternating_pg_ranks_are_numbered_node_major(self):
        first = self.check_group("alternate", [0, 2, 1, 3], "hsap")
        second = self.check_group("alternate_again", [0, 2, 1, 3], "ring")
        self.assertRegex(first, r"^pg-[0-9a-f]{32}$")
        self.assertNotEqual(first, second)

    def test_init_from_env_orders_a_node_by_local_rank(self):
        self.assertEqual(self.check_group("from_env", [1, 0, 3, 2]), "pg-test-given")

    def test_unequal_ranks_per_node_fail_on_every_rank(self):
        a0, a1 = self.addresses
        for r in self.results:
            e = r["unequal"]
            self.assertEqual(e["error"], "InvalidInputError")
            self.assertIn(f"{a0}: 3 (pg ranks 0, 1, 2); {a1}: 1 (pg ranks 3)", e["message"])

    def test_one_ranks_bad_address_fails_every_rank(self):
        for rank, r in enumerate(self.results):
            e = r["bad_address"]
            self.assertEqual(e["code"], "INVALID_ARGUMENT")
            self.assertIn("$HSAP_ADDRESS is 'nonsense'", e["message"])
            if rank != 2:
                self.assertIn("pg rank 2 could not join the group", e["message"])

    def test_different_names_fail_every_rank(self):
        for r in self.results:
            self.assertEqual(r["names"]["error"], "InvalidInputError")
            self.assertIn("pg rank 0: 'a', pg rank 1: 'b'", r["names"]["message"])

    def test_a_daemon_without_an_address_names_hsap_address(self):
        for r in self.results:
            e = r["no_address"]
            self.assertEqual(e["code"], "FAILED_PRECONDITION")
            self.assertIn("set $HSAP_ADDRESS=host:port", e["message"])

    def test_one_rank_without_a_daemon_fails_every_rank(self):
        for rank, r in enumerate(self.results):
            e = r["no_daemon"]
            self.assertEqual(e["code"], "UNAVAILABLE")
            self.assertIn("no hsapd session socket at /nonexistent/hsapd.sock.session",
                          e["message"])
            if rank != 1:
                self.assertIn("pg rank 1 could not join the group", e["message"])


class LocalChecksTest(unittest.TestCase):
    """What needs no process group."""

    def test_plan_group_orders_nodes_by_first_pg_rank_and_slots(self):
        entries = [("ok", "b:1", 1, None, "pg-x"), ("ok", "a:1", None, None, "pg-y"),
                   ("ok", "b:1", 0, None, "pg-z"), ("ok", "a:1", None, None, "pg-w")]
        self.assertEqual(plan_group(entries), ("pg-x", ["b:1", "a:1"], 2, [2, 0, 1, 3]))

    def test_plan_group_rejects_a_slot_taken_twice_and_mixed_slots(self):
        taken = [("ok", "a:1", 0, None, "n"), ("ok", "a:1", 0, None, "n")]
        with self.assertRaisesRegex(hsap.InvalidInputError,
                                    "pg ranks 0 and 1 both give device slot 0"):
            plan_group(taken)
        mixed = [("ok", "a:1", 0, None, "n"), ("ok", "a:1", None, None, "n")]
        with self.assertRaisesRegex(hsap.InvalidInputError, "some ranks give a device slot"):
            plan_group(mixed)

    def test_from_process_group_needs_torch_distributed(self):
        with self.assertRaises(hsap.HsapError) as ctx:
            hsap.Group.from_process_group()
        self.assertEqual(ctx.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("init_process_group", ctx.exception.message)

    def test_init_from_env_names_the_variable(self):
        good = dict(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        cases = [({"RANK": None}, r"\$RANK is not set"),
                 ({"RANK": "x"}, r"\$RANK is 'x'; it must be an integer in \[0, 4\)"),
                 ({"RANK": "4"}, r"\$RANK is '4'"),
                 ({"LOCAL_RANK": "2"}, r"\$LOCAL_RANK is '2'; it must be an integer in \[0, 2\)"),
                 ({"WORLD_SIZE": "0"}, r"\$WORLD_SIZE is '0'"),
                 ({"MASTER_ADDR": ""}, r"\$MASTER_ADDR is ''"),
                 ({"MASTER_PORT": "70000"}, r"\$MASTER_PORT is '70000'")]
        for change, message in cases:
            env = {k: v for k, v in dict(good, **change).items() if v is not None}
            with self.subTest(change=change), mock.patch.dict(os.environ, env, clear=True):
                with self.assertRaisesRegex(hsap.InvalidInputError, message):
                    hsap.init_from_env()


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""The hsap package is layered: every module imports only modules of its own
or a lower layer, the import graph has no cycle, and the bottom module
(hsap.client: the session and gRPC) imports no other hsap module.

    layer 0  client                      session, regions, gRPC stubs, errors
    layer 1  errors, daemon, reference   (errors re-exports client's classes)
    layer 2  groups                      Group, formation from a process group
    layer 3  masks, attention, flash, plans
    layer 4  sharding, nn                shard / unshard, ContextParallelAttention
    layer 5  distributed                 torchrun glue (init_from_env)

Two checks:

* static: every module's source is parsed with `ast`, imports inside
  functions and classes included, and the graph of hsap-module imports is
  checked for cycles (the cycle is named, with the line of each edge), for
  edges that go up a layer, and for imports that hide an edge (`import
  hsap`, `from hsap import <name that is not a module>`, importlib);
* dynamic: each module is imported alone in a fresh /usr/bin/python3
  (the package's `__init__` loads nothing eagerly), and `import hsap.client`
  loads no hsap module but the package, itself and the generated hsap.v1
  protos; every public name of `hsap` resolves.
The generated hsap.v1 modules are not part of the graph (they import only
each other and protobuf/grpc).
"""

import ast
import json
import os
import subprocess
import sys
import unittest

import hsap

LAYERS = {
    "client": 0,
    "errors": 1, "daemon": 1, "reference": 1,
    "groups": 2,
    "masks": 3, "attention": 3, "flash": 3, "plans": 3,
    "sharding": 4, "nn": 4,
    "distributed": 5,
}
BOTTOM = "client"
PACKAGE_DIR = os.path.dirname(os.path.abspath(hsap.__file__))


def module_names():
    """The hsap modules (file stems) next to hsap/__init__.py, v1 excluded."""
    return sorted(f[:-3] for f in os.listdir(PACKAGE_DIR)
                  if f.endswith(".py") and f != "__init__.py")


def imports_of(name, modules):
    """(edges, hidden) of module `name`: edges = [(target module, line)] for
    every import of another hsap module, anywhere in the file; hidden =
    [(line, what)] for imports that hide which module they need."""
    path = os.path.join(PACKAGE_DIR, name + ".py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    edges, hidden = [], []

    def module_of(dotted):
        parts = dotted.split(".")
        if parts[0] != "hsap":
            return None
        if len(parts) == 1:
            return "hsap"  # the package facade
        return None if parts[1] == "v1" else parts[1]

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = module_of(alias.name)
                if target == "hsap":
                    hidden.append((node.lineno, f"import {alias.name}"))
                elif target is not None:
                    edges.append((target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = "hsap" + ("." + node.module if node.module else "")
            else:
                base = node.module or ""
            target = module_of(base)
            if target == "hsap":
                for alias in node.names:
                    if alias.name in modules:
                        edges.append((alias.name, node.lineno))
                    elif alias.name != "v1":
                        hidden.append((node.lineno, f"from hsap import {alias.name} (import it "
                                       "from the module that defines it)"))
            elif target is not None:
                edges.append((target, node.lineno))
        elif isinstance(node, ast.Call):
            func = node.func
            called = (func.attr if isinstance(func, ast.Attribute) else
                      func.id if isinstance(func, ast.Name) else "")
            if called in ("import_module", "__import__"):
                hidden.append((node.lineno, f"{called}(...) (a dynamic import)"))
    return [(t, line) for t, line in edges if t != name], hidden


def import_graph():
    modules = module_names()
    graph, hidden = {}, {}
    for m in modules:
        graph[m], hidden[m] = imports_of(m, set(modules))
    return graph, hidden


def find_cycles(graph, limit=20):
    """Every elementary cycle (up to `limit`), each as [(module, line of its
    import of the next), ...] starting at its smallest module name."""
    cycles = []

    def walk(start, m, path, on_path):
        for target, line in sorted(graph.get(m, ())):
            if target == start:
                cycles.append(path + [(m, line)])
            elif target > start and target not in on_path and len(cycles) < limit:
                on_path.add(target)
                walk(start, target, path + [(m, line)], on_path)
                on_path.discard(target)

    for start in sorted(graph):
        walk(start, start, [], {start})
    return cycles[:limit]


def describe_cycle(cycle):
    hops = [f"hsap.{m} (line {line})" for m, line in cycle]
    return " -> ".join(hops + [f"hsap.{cycle[0][0]}"])


class StaticLayeringTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.graph, cls.hidden = import_graph()

    def test_every_module_has_a_layer(self):
        missing = [m for m in self.graph if m not in LAYERS]
        self.assertEqual(missing, [], "add these modules to LAYERS (and the module comment)")

    def test_no_import_cycle(self):
        cycles = find_cycles(self.graph)
        if cycles:
            self.fail("import cycles:\n  " + "\n  ".join(describe_cycle(c) for c in cycles))

    def test_bottom_module_imports_no_other_hsap_module(self):
        self.assertEqual(self.graph[BOTTOM], [],
                         f"hsap.{BOTTOM} imports " + ", ".join(
                             f"hsap.{t} (line {line})" for t, line in self.graph[BOTTOM]))
        self.assertEqual(self.hidden[BOTTOM], [])

    def test_imports_go_down_the_layers(self):
        upward = [f"hsap.{m} (layer {LAYERS[m]}) imports hsap.{t} (layer {LAYERS[t]}) at line "
                  f"{line}" for m, edges in sorted(self.graph.items()) for t, line in edges
                  if m in LAYERS and t in LAYERS and LAYERS[t] > LAYERS[m]]
        self.assertEqual(upward, [])

    def test_no_hidden_imports(self):
        found = [f"hsap.{m} line {line}: {what}" for m, items in sorted(self.hidden.items())
                 for line, what in items]
        self.assertEqual(found, [])

    def test_the_checker_finds_a_cycle(self):
        graph = {"a": [("b", 3)], "b": [("c", 7)], "c": [("a", 9)], "d": [("a", 1)]}
        self.assertEqual([describe_cycle(c) for c in find_cycles(graph)],
                         ["hsap.a (line 3) -> hsap.b (line 7) -> hsap.c (line 9) -> hsap.a"])
        two = {"a": [("b", 1), ("c", 2)], "b": [("a", 4)], "c": [("a", 5)], "d": [("d", 6)]}
        self.assertEqual([describe_cycle(c) for c in find_cycles(two)],
                         ["hsap.a (line 1) -> hsap.b (line 4) -> hsap.a",
                          "hsap.a (line 2) -> hsap.c (line 5) -> hsap.a",
                          "hsap.d (line 6) -> hsap.d"])
        self.assertEqual(find_cycles({"a": [("b", 1)], "b": [], "c": [("a", 2), ("b", 3)]}), [])


_PROBE = r"""
import importlib, json, sys
name = sys.argv[1]
importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m == "hsap" or m.startswith("hsap."))))
"""

_PUBLIC = r"""
import hsap
missing = [n for n in hsap.__all__ if getattr(hsap, n, None) is None]
ns = {}
exec("from hsap import *", ns)
missing += [n for n in hsap.__all__ if n not in ns]
import hsap.errors, hsap.client
assert hsap.errors.HsapError is hsap.HsapError is hsap.client.HsapError
assert hsap.client.Client is hsap.Client and hsap.client.connect is hsap.connect
print(missing)
"""


class FreshInterpreterTest(unittest.TestCase):
    def run_python(self, code, *args):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ))
        self.assertEqual(proc.returncode, 0, f"{' '.join(args)}:\n{proc.stderr[-3000:]}")
        return proc.stdout.strip().splitlines()[-1]

    def test_each_module_imports_alone(self):
        for m in module_names():
            with self.subTest(module=m):
                loaded = json.loads(self.run_python(_PROBE, "hsap." + m))
                self.assertIn("hsap." + m, loaded)

    def test_the_bottom_module_loads_no_other_hsap_module(self):
        loaded = json.loads(self.run_python(_PROBE, "hsap." + BOTTOM))
        others = [m for m in loaded if m not in ("hsap", "hsap." + BOTTOM)
                  and not m.startswith("hsap.v1")]
        self.assertEqual(others, [])
        print(f"  import hsap.{BOTTOM} loads: {', '.join(loaded)}")

    def test_public_names_resolve(self):
        self.assertEqual(self.run_python(_PUBLIC), "[]")


class GeneratedProtosTest(unittest.TestCase):
    """hsap.v1 holds the modules of every proto under proto/hsap/v1/ (the
    source tree's, found through the real path of the package's sources)."""

    def test_every_proto_has_its_modules(self):
        sources = os.path.dirname(os.path.realpath(os.path.join(PACKAGE_DIR, "__init__.py")))
        repo = os.path.normpath(os.path.join(sources, "..", "..", ".."))
        proto_dir = os.path.join(repo, "proto", "hsap", "v1")
        self.assertTrue(os.path.isdir(proto_dir), f"no {proto_dir}")
        protos = sorted(f[:-6] for f in os.listdir(proto_dir) if f.endswith(".proto"))
        self.assertIn("peer", protos)
        for p in protos:
            with self.subTest(proto=p):
                for suffix in ("_pb2", "_pb2_grpc"):
                    self.run_import(f"hsap.v1.{p}{suffix}")

    def run_import(self, name):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                              text=True, timeout=60, env=dict(os.environ))
        self.assertEqual(proc.returncode, 0, f"import {name}:\n{proc.stderr[-2000:]}")


if __name__ == "__main__":
    unittest.main(verbosity=2)

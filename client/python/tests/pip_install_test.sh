#!/usr/bin/env bash
# `pip install ./client/python` as a user does it, offline: copies the
# package's sources (pyproject.toml, setup.py, README.md, hsap/*.py) and the
# repository's proto/hsap/v1/*.proto from the runfiles into a bare source
# tree under $TEST_TMPDIR (so the in-tree build writes nothing into the
# workspace), makes a fresh virtual environment with Debian's
# /usr/bin/python3 (--system-site-packages: python3-torch, -grpcio, -protobuf),
# installs with `pip install --no-index --no-build-isolation` (setup.py runs
# protoc and grpc_python_plugin), then, from an empty directory outside any
# source tree and with no PYTHONPATH, imports hsap from the venv, starts
# hsapd (the runfile //server:hsapd) and checks one flash_attn_varlen_func
# call (forward + backward) against the float64 reference.
set -euo pipefail
runfiles="${TEST_SRCDIR:?run this under bazel test}/hsap"
tmp="${TEST_TMPDIR:?}"
unset PYTHONPATH
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

src="$tmp/src"
mkdir -p "$src/client/python/hsap" "$src/proto/hsap/v1"
cp -L "$runfiles"/client/python/{pyproject.toml,setup.py,README.md} "$src/client/python/"
cp -L "$runfiles"/client/python/hsap/*.py "$src/client/python/hsap/"
cp -L "$runfiles"/proto/hsap/v1/*.proto "$src/proto/hsap/v1/"
test ! -e "$src/client/python/hsap/v1"  # nothing generated is carried

start=$SECONDS
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
(cd "$src" && "$tmp/venv/bin/pip" install --no-index --no-build-isolation ./client/python) \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; exit 1; }
echo "pip_install_test: venv + pip install took $((SECONDS - start)) s"
tail -n 1 "$tmp/pip.log"

mkdir -p "$tmp/elsewhere"
cd "$tmp/elsewhere"
HSAPD="$runfiles/server/hsapd" VENV="$tmp/venv" "$tmp/venv/bin/python" - <<'PY'
import os
import sys

import torch

import hsap
import hsap.v1.attention_pb2
from hsap.daemon import LocalDaemon
from hsap.reference import flash_varlen_reference

venv = os.path.realpath(os.environ["VENV"])
for module in (hsap, hsap.v1.attention_pb2):
    path = os.path.realpath(module.__file__)
    assert path.startswith(venv + os.sep), f"{module.__name__} imported from {path}, not the venv"
assert sys.prefix != sys.base_prefix, "not running in the virtual environment"

with LocalDaemon(devices="cpu:1") as daemon:
    client = hsap.connect(daemon.socket)
    g = torch.Generator().manual_seed(0)
    cu_q, cu_k = [0, 20, 50], [0, 35, 45]
    q = (torch.rand(50, 4, 59, generator=g) * 2 - 1).requires_grad_()
    k = (torch.rand(45, 2, 59, generator=g) * 2 - 1).requires_grad_()
    v = (torch.rand(45, 2, 59, generator=g) * 2 - 1).requires_grad_()
    d_o = (torch.rand(50, 4, 59, generator=g) * 2 - 1)
    out = hsap.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 35, causal=True, client=client)
    out.backward(d_o)
    xs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref, _ = flash_varlen_reference(*xs, cu_q, cu_k, True)
    ref.backward(d_o.double())
    errors = {}
    for name, got, want in (("out", out, ref), ("dq", q.grad, xs[0].grad),
                            ("dk", k.grad, xs[1].grad), ("dv", v.grad, xs[2].grad)):
        errors[name] = ((got.double() - want).abs().max() / want.abs().max()).item()
    client.close()
print("pip_install_test: hsap from", os.path.dirname(hsap.__file__), "errors", errors)
assert max(errors.values()) <= 1e-5, errors
print("pip_install_test: PASSED")
PY

#!/usr/bin/python3
"""Trains a tiny byte-level causal transformer with its attention computed by
hsapd as a 4-rank collective, next to a single-process PyTorch reference, and
checks that the two losses agree at every step.

    /usr/bin/python3 examples/train_tiny_transformer.py            # starts hsapd --devices=cpu:4
    /usr/bin/python3 examples/train_tiny_transformer.py --socket /tmp/hsap/hsapd.sock

Data: real text, the Python sources of this repository (client/python/**/*.py
and examples/*.py, generated modules left out) as bytes, sorted by path; each
file is a document, cut into pieces of at most --max-doc-len bytes as packing
data loaders do. Step s trains on the packed tokens [s*T, (s+1)*T) of that
stream (T = --tokens, 1024); cu_seqlens are the document boundaries inside it.
Positions restart at every document; targets are the next byte of the same
document.

Model: 2 pre-LayerNorm blocks, d_model 128, 4 heads of 32 (hsapd takes
head_dim in [32, 256]), MLP 4x, vocabulary 256, learned in-document positions.
Adam, fixed seed.

What is distributed: in every layer, forward and backward, the attention runs
through hsapd as one collective call of a 4-rank group (hsap.Group, strategy
--strategy, layout from hsap.dispatch). Each rank is a thread with its own
session that holds only its dispatch's tokens of Q, K, V and gets back only
their O (and, in the backward call, their dQ, dK, dV), through
hsap.varlen_attn's autograd Function. The embeddings, LayerNorms,
projections, MLP and loss are computed once in this process on the full
packed sequence (what every rank would compute for its own tokens).

Reference: the same model from the same initial weights with plain masked
attention (block-diagonal causal mask, float64 softmax) in this process.
Exit status 1 unless, at every step, the losses agree to <= 1e-4 relative and
so do the logits (max |difference| / max |logit|). The logits check is the
sharp one: near initialisation the loss hardly depends on attention (a wrong
softmax scale moves it by less than 1e-4 relative, but the logits by ~1e-2).
"""

import argparse
import concurrent.futures
import copy
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

try:
    import hsap.client  # noqa: F401 - the package and its generated hsap.v1 modules
except ImportError:  # run from the source tree: sources + Bazel's generated modules
    sys.path[:0] = [os.path.join(REPO, "client", "python"),
                    os.path.join(REPO, "bazel-bin", "client", "python"),
                    os.path.join(REPO, "bazel-out", "k8-opt", "bin", "client", "python")]
    for _name in [m for m in sys.modules if m == "hsap" or m.startswith("hsap.")]:
        del sys.modules[_name]  # hsap.__path__ was computed without the generated tree
    import hsap.client  # noqa: F401
import hsap  # noqa: E402
from hsap.daemon import LocalDaemon

TOLERANCE = 1e-4


# --- data ----------------------------------------------------------------------


def python_sources(root):
    """Sorted repository-relative paths of the corpus files under `root`
    (non-empty, not generated: the same in the source tree and the runfiles)."""
    paths = []
    for top in (os.path.join("client", "python"), "examples"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in filenames:
                path = os.path.join(dirpath, f)
                generated = f.endswith(("_pb2.py", "_pb2_grpc.py"))
                if f.endswith(".py") and not generated and os.path.getsize(path) > 0:
                    paths.append(os.path.relpath(path, root))
    return sorted(paths)


def document_stream(root, max_doc_len):
    """(tokens uint8 -> int64 [N], document starts [D]) of the corpus."""
    data, starts = bytearray(), []
    for path in python_sources(root):
        with open(os.path.join(root, path), "rb") as f:
            text = f.read()
        for at in range(0, len(text), max_doc_len):
            starts.append(len(data))
            data += text[at:at + max_doc_len]
    return torch.tensor(list(data), dtype=torch.int64), starts


def packed_batch(tokens, starts, step, length):
    """Tokens [length] of window `step`, cu_seqlens, in-document positions
    [length] and next-byte targets [length] (-100 at each document's end)."""
    begin, end = step * length, (step + 1) * length
    if end > len(tokens):
        raise SystemExit(f"the corpus has {len(tokens)} bytes, too few for step {step}")
    cu = [0] + [s - begin for s in starts if begin < s < end] + [length]
    x = tokens[begin:end]
    pos = torch.empty(length, dtype=torch.int64)
    target = torch.full((length,), -100, dtype=torch.int64)
    for a, b in zip(cu[:-1], cu[1:]):
        pos[a:b] = torch.arange(b - a)
        target[a:b - 1] = x[a + 1:b]
    return x, cu, pos, target


# --- attention: reference and hsapd --------------------------------------------


def reference_attention(q, k, v, cu):
    """Plain masked attention: q, k, v [T, H, D] -> [T, H, D]; query i sees key
    j iff they are in the same document and j <= i. Softmax in float64."""
    t, h, d = q.shape
    doc = torch.zeros(t, dtype=torch.int64)
    for i in range(len(cu) - 1):
        doc[cu[i]:cu[i + 1]] = i
    pos = torch.arange(t)
    allowed = (doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :])
    scores = torch.einsum("ihd,jhd->hij", q.double(), k.double()) / math.sqrt(d)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hij,jhd->ihd", probs, v.double()).to(q.dtype)


class RankGroup:
    """`ranks` rank threads, each with its own hsapd session and Group."""

    def __init__(self, socket_path, ranks, strategy, assignment="balanced"):
        self.ranks = ranks
        self.strategy = strategy
        self.assignment = assignment
        self.clients = [hsap.connect(socket_path) for _ in range(ranks)]
        self.groups = [hsap.Group("tiny-transformer", r, ranks, client=self.clients[r],
                                  assignment=assignment) for r in range(ranks)]
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=ranks)
        self.layout = None

    def set_batch(self, cu, heads, head_dim):
        """The token layout of this batch (the same for every layer)."""
        self.layout = hsap.dispatch(cu, self.ranks, heads, heads, head_dim, torch.float32,
                                    self.strategy, self.assignment, client=self.clients[0])
        self.rows = [self.layout.indices(r) for r in range(self.ranks)]

    def each_rank(self, fn):
        """fn(rank) on every rank thread at once (the calls are collectives)."""
        return [f.result() for f in [self.pool.submit(fn, r) for r in range(self.ranks)]]

    def close(self):
        self.pool.shutdown()
        for c in self.clients:
            c.close()


class HsapGroupAttention(torch.autograd.Function):
    """Full-sequence q, k, v [T, H, D] -> O [T, H, D], computed by the rank
    threads: rank r submits rows layout.indices(r) to hsap.varlen_attn (its
    own autograd graph), and in backward runs that graph's backward, which
    makes the rank's Attention.Backward call."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_seqlen, ranks):
        def rank_forward(r):
            rows = ranks.rows[r]
            with torch.enable_grad():
                local = [x[rows].detach().requires_grad_() for x in (q, k, v)]
                out = hsap.varlen_attn(*local, cu, max_seqlen, causal=True,
                                       group=ranks.groups[r], strategy=ranks.strategy)
            return local, out

        per_rank = ranks.each_rank(rank_forward)
        o = torch.empty_like(q)
        for r, (_, out) in enumerate(per_rank):
            o[ranks.rows[r]] = out.detach()
        ctx.per_rank, ctx.ranks = per_rank, ranks
        return o

    @staticmethod
    def backward(ctx, grad_o):
        ranks = ctx.ranks

        def rank_backward(r):
            local, out = ctx.per_rank[r]
            torch.autograd.backward(out, grad_o[ranks.rows[r]])
            return [x.grad for x in local]

        grads = ranks.each_rank(rank_backward)
        dq, dk, dv = (torch.zeros_like(grad_o) for _ in range(3))
        for r, (gq, gk, gv) in enumerate(grads):
            rows = ranks.rows[r]
            dq[rows], dk[rows], dv[rows] = gq, gk, gv
        ctx.per_rank = None
        return dq, dk, dv, None, None, None


# --- model ---------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x, attention):
        t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, self.heads, d // self.heads).unbind(1)
        x = x + self.proj(attention(q.contiguous(), k.contiguous(), v.contiguous()).reshape(t, d))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=256, d_model=128, heads=4, layers=2, max_positions=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_positions, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, x, pos, attention):
        h = self.tok(x) + self.pos(pos)
        for block in self.blocks:
            h = block(h, attention)
        return self.head(self.ln(h))


# --- training ------------------------------------------------------------------


def train(args, socket_path):
    torch.manual_seed(args.seed)
    tokens, starts = document_stream(args.source_root, args.max_doc_len)
    model = TinyTransformer(max_positions=args.max_doc_len)
    reference = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=args.lr)
    heads = model.blocks[0].heads
    head_dim = model.blocks[0].qkv.in_features // heads
    ranks = RankGroup(socket_path, args.ranks, args.strategy)
    print(f"corpus: {len(python_sources(args.source_root))} Python files, {len(tokens)} bytes, "
          f"{len(starts)} documents (<= {args.max_doc_len} bytes); {args.tokens} tokens a step")
    print(f"attention: {args.ranks}-rank hsapd group, strategy {args.strategy}; reference: "
          "masked attention in this process")
    print(f"{'step':>4} {'docs':>4} {'strategy':>9} {'hsap loss':>12} {'reference':>12} "
          f"{'rel diff':>9} {'max|dlogit|':>11} {'hsap s':>7}")
    worst = worst_logits = 0.0
    try:
        for step in range(args.steps):
            x, cu, pos, target = packed_batch(tokens, starts, step, args.tokens)
            max_seqlen = max(b - a for a, b in zip(cu[:-1], cu[1:]))
            ranks.set_batch(cu, heads, head_dim)

            t0 = time.monotonic()
            opt.zero_grad()
            logits = model(x, pos, lambda q, k, v: HsapGroupAttention.apply(
                q, k, v, cu, max_seqlen, ranks))
            loss = F.cross_entropy(logits, target, ignore_index=-100)
            loss.backward()
            opt.step()
            hsap_seconds = time.monotonic() - t0

            ref_opt.zero_grad()
            ref_logits = reference(x, pos, lambda q, k, v: reference_attention(q, k, v, cu))
            ref_loss = F.cross_entropy(ref_logits, target, ignore_index=-100)
            ref_loss.backward()
            ref_opt.step()

            rel = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
            # The models differ only in how attention was computed (and in
            # what that did to earlier steps' updates).
            logit_diff = (logits - ref_logits).abs().max().item()
            logit_rel = logit_diff / ref_logits.abs().max().item()
            worst_logits = max(worst_logits, logit_rel)
            worst = max(worst, rel)
            flag = "" if max(rel, logit_rel) <= TOLERANCE else "  <-- exceeds 1e-4"
            print(f"{step + 1:>4} {len(cu) - 1:>4} {ranks.layout.strategy:>9} {loss.item():>12.6f} "
                  f"{ref_loss.item():>12.6f} {rel:>9.2e} {logit_diff:>11.2e} {hsap_seconds:>7.3f}{flag}",
                  flush=True)
    finally:
        ranks.close()
    calls = ranks.groups[0].call_seq
    print(f"{calls} collective calls per rank ({args.steps} steps x {len(model.blocks)} layers x "
          f"forward + backward); worst relative difference: loss {worst:.2e}, logits "
          f"{worst_logits:.2e}")
    if worst > TOLERANCE or worst_logits > TOLERANCE:
        print(f"FAIL: loss or logits differ by more than {TOLERANCE} relative", file=sys.stderr)
        return 1
    print(f"OK: hsapd and the reference agree to <= {TOLERANCE} at every step (loss, and "
          "max |logit difference| / max |logit|)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", help="hsapd socket to use (default: start one with --devices=cpu:4)")
    p.add_argument("--hsapd", help="hsapd binary to start (default: see hsap.daemon.find_hsapd)")
    p.add_argument("--source-root", default=REPO, help="repository root holding the corpus")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--tokens", type=int, default=1024, help="packed tokens per step")
    p.add_argument("--max-doc-len", type=int, default=384)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.socket:
        return train(args, args.socket)
    with LocalDaemon(devices=f"cpu:{args.ranks}", binary=args.hsapd) as daemon:
        return train(args, daemon.socket)


if __name__ == "__main__":
    sys.exit(main())

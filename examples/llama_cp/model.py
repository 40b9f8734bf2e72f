"""A Llama-style decoder and its packed byte corpus, for examples/llama_cp.

Model (sizes by flag, see add_model_args): token embedding (bytes, 256),
`layers` pre-norm blocks — RMSNorm, attention with rotary position
embeddings at per-document positions and grouped-query heads (`heads`
query heads of `head_dim`, `kv_heads` key/value heads), RMSNorm, SwiGLU MLP
(`ffn` hidden) — a final RMSNorm and an output projection. No biases, no
dropout; weights N(0, 0.02) from one seed, so every process that builds it
from the same seed holds the same weights.

The attention core is passed in: Llama(config, core) calls core(q, k, v,
layout) with q [T, heads, head_dim] and k, v [T, kv_heads, head_dim] of the
rows it runs on, and `layout` whatever the caller passed to forward (a
hsap.Sharding for hsap.nn.ContextParallelAttention, the document
boundaries for DocumentAttention, the single-process reference).

Corpus: the top-level *.py files of the Python standard library of the
interpreter running this (sorted by name; /usr/lib/python3.11 for Debian's
/usr/bin/python3), or with --corpus=repo this repository's Python sources,
as bytes. The file stream is cut into documents of lengths drawn from a
seeded log-uniform distribution in [--min-doc, --max-doc] (packing data
loaders see documents of every length; the longest exceed a rank's share),
and step s trains on tokens [s*T, (s+1)*T) of the stream, T = --tokens.
Positions restart at every document; a token's target is the next byte of
its document (-100 at a document's last token).
"""

import glob
import math
import os
import random
import sysconfig

import torch
import torch.nn.functional as F


def add_model_args(p):
    p.add_argument("--dim", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4, help="query heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (GQA)")
    p.add_argument("--ffn", type=int, default=344, help="SwiGLU hidden width")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tokens", type=int, default=2048, help="packed tokens per step")
    p.add_argument("--min-doc", type=int, default=16)
    p.add_argument("--max-doc", type=int, default=1536)
    p.add_argument("--corpus", default="stdlib", choices=("stdlib", "repo"))
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=10, help="steps of linear warmup")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="cosine decay to this fraction of --lr at the last step")
    p.add_argument("--clip", type=float, default=0.0,
                   help="gradient norm clipping (0, the default: off; see README.md)")
    p.add_argument("--seed", type=int, default=0)


# --- data ------------------------------------------------------------------------


def learning_rate(args, step, steps):
    """The learning rate of 0-based step `step` of `steps`: linear warmup
    over --warmup steps, then a cosine to --min-lr-ratio of --lr at the last
    step (a function of the step alone, so a resumed run continues it)."""
    warm = min(1.0, (step + 1) / max(1, args.warmup))
    progress = step / max(1, steps - 1)
    cosine = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return args.lr * warm * cosine


def corpus_files(kind, repo):
    """Sorted paths of the corpus files."""
    if kind == "stdlib":
        return sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    paths = []
    for top in ("client/python/hsap", "examples"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(repo, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    return sorted(paths)


class Corpus:
    """The byte stream and its document starts (see the module comment)."""

    def __init__(self, args, repo):
        self.files = corpus_files(args.corpus, repo)
        data = bytearray()
        for path in self.files:
            with open(path, "rb") as f:
                data += f.read()
        self.tokens = torch.tensor(list(data), dtype=torch.int64)
        rng = random.Random(args.seed)
        low, high = math.log(args.min_doc), math.log(args.max_doc)
        self.starts, at = [], 0
        while at < len(data):
            self.starts.append(at)
            at += int(math.exp(rng.uniform(low, high)))
        self.length = args.tokens

    def steps_available(self):
        return len(self.tokens) // self.length

    def batch(self, step):
        """(ids [T], targets [T], cu_seqlens list, positions [T]) of step `step`."""
        begin, end = step * self.length, (step + 1) * self.length
        if end > len(self.tokens):
            raise SystemExit(f"the corpus has {len(self.tokens)} bytes, too few for step "
                             f"{step + 1}")
        import bisect
        first = bisect.bisect_right(self.starts, begin)
        last = bisect.bisect_left(self.starts, end)
        cu = [0] + [s - begin for s in self.starts[first:last]] + [self.length]
        ids = self.tokens[begin:end]
        targets = torch.full((self.length,), -100, dtype=torch.int64)
        positions = torch.empty(self.length, dtype=torch.int64)
        for a, b in zip(cu[:-1], cu[1:]):
            targets[a:b - 1] = ids[a + 1:b]
            positions[a:b] = torch.arange(b - a)
        return ids, targets, cu, positions


# --- model -----------------------------------------------------------------------


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary(x, positions, theta):
    """x [T, H, D] rotated by position (Llama's rotate-half form, in fp32)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :]
    x32 = x.float()
    half = torch.cat([-x32[..., d // 2:], x32[..., :d // 2]], dim=-1)
    return x32 * cos + half * sin


class Attention(torch.nn.Module):
    def __init__(self, config, core):
        super().__init__()
        self.heads, self.kv_heads = config.heads, config.kv_heads
        self.head_dim = config.dim // config.heads
        self.theta = config.rope_theta
        self.wq = torch.nn.Linear(config.dim, self.heads * self.head_dim, bias=False)
        self.wk = torch.nn.Linear(config.dim, self.kv_heads * self.head_dim, bias=False)
        self.wv = torch.nn.Linear(config.dim, self.kv_heads * self.head_dim, bias=False)
        self.wo = torch.nn.Linear(self.heads * self.head_dim, config.dim, bias=False)
        self.core = core

    def forward(self, x, positions, layout):
        t = x.shape[0]
        q = self.wq(x).view(t, self.heads, self.head_dim)
        k = self.wk(x).view(t, self.kv_heads, self.head_dim)
        v = self.wv(x).view(t, self.kv_heads, self.head_dim)
        # Rotary in fp32, then back to the dtype autocast gave v (bf16 under
        # bf16 autocast): the attention runs in one dtype.
        q = rotary(q, positions, self.theta).to(v.dtype)
        k = rotary(k, positions, self.theta).to(v.dtype)
        out = self.core(q, k, v, layout)
        return self.wo(out.reshape(t, self.heads * self.head_dim))


class SwiGLU(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, config, core):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim)
        self.attention = Attention(config, core)
        self.ffn_norm = RMSNorm(config.dim)
        self.ffn = SwiGLU(config.dim, config.ffn)

    def forward(self, x, positions, layout):
        x = x + self.attention(self.attention_norm(x), positions, layout)
        return x + self.ffn(self.ffn_norm(x))


class Llama(torch.nn.Module):
    """Llama(config, core): forward(ids [T], positions [T], layout) ->
    logits [T, 256] (fp32)."""

    def __init__(self, config, core):
        super().__init__()
        if config.dim % config.heads or config.heads % config.kv_heads:
            raise SystemExit(f"--dim {config.dim} must be a multiple of --heads {config.heads}, "
                             f"and --heads of --kv-heads {config.kv_heads}")
        torch.manual_seed(config.seed)
        self.embed = torch.nn.Embedding(256, config.dim)
        self.blocks = torch.nn.ModuleList(Block(config, core) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim)
        self.output = torch.nn.Linear(config.dim, 256, bias=False)
        for m in self.modules():
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, positions, layout):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, positions, layout)
        return self.output(self.norm(x)).float()


class DocumentAttention(torch.nn.Module):
    """The reference core: plain masked attention over the whole pack, in
    fp32 (from q's dtype; the output back in it): query i sees key j iff
    both are in one document and j <= i. The block-diagonal mask is applied
    document by document (a causal mask per document block: the pairs of
    the full T x T mask, without its T^2 work). GQA: query head h reads
    key/value head h // (heads / kv_heads). layout: cu_seqlens."""

    def forward(self, q, k, v, cu_seqlens):
        length, heads, d = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        longest = max(b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]))
        future = torch.ones(longest, longest, dtype=torch.bool).triu(1)  # j > i: masked
        outs = []
        with torch.autocast("cpu", enabled=False):
            for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:]):
                if b == a:
                    continue
                qd = q[a:b].float().view(b - a, kv_heads, group, d)
                kd, vd = k[a:b].float(), v[a:b].float()
                scores = torch.einsum("ikgd,jkd->kgij", qd, kd) / math.sqrt(d)
                scores = scores.masked_fill(future[:b - a, :b - a], float("-inf"))
                probs = torch.softmax(scores, dim=-1)
                outs.append(torch.einsum("kgij,jkd->ikgd", probs, vd).reshape(b - a, heads, d))
        return torch.cat(outs).to(q.dtype)

#!/usr/bin/python3
"""One training run of the Llama-style model (model.py): context-parallel
under torchrun through hsapd, or the single-process reference.

    # a context-parallel process (under torchrun; HSAP_SOCKET: its node's hsapd)
    train.py --mode=cp --steps=60 --out=cp.json
    # the reference: one process, the whole pack, plain masked attention
    train.py --mode=reference --steps=60 --out=ref.json

run.py starts both (and the daemons) and compares them; see README.md.

Context-parallel step (every process):

    ids, targets, cu, _ = corpus.batch(step)            # the whole pack, every rank
    (ids, targets), sharding = hsap.shard([ids, targets], cu, group, heads=H,
                                          kv_heads=Hkv, head_dim=D, dtype=dtype)
    logits = model(ids, sharding.position_ids, sharding)  # this rank's rows only
    loss = cross_entropy(logits, targets, reduction="sum") / tokens counted globally
    loss.backward(); all_reduce(gradients); clip, optimizer.step()

The model's attention is hsap.nn.ContextParallelAttention(group): every
layer's forward and backward is one collective call of the 4 processes
across both daemons. The loss is the sum over local tokens divided by the
global count, so the gradients summed over the ranks (one all_reduce) are
the full batch's and every process takes the same step (gradient norm
clipped to --clip when set, AdamW at the step's learning rate: warmup, then cosine
decay): the weights stay identical everywhere, as under DDP.

Output (--out, JSON): per step the loss, wall seconds, tokens/s, attention
seconds; at --check-steps the unsharded logits' digest (the reference and
the cp run save the logits of those steps, hsap.unshard gathers them) to
--logits. --save-at=k writes a checkpoint (model, optimizer, step) after
step k to --checkpoint; --resume=PATH continues from one.
--dtype=bf16 runs under torch.autocast("cpu", bfloat16) (attention in
bf16: hsapd accumulates in fp32 and rounds its output once; the reference
computes its softmax in fp32 from the bf16 q, k, v and rounds the same way).

Fault injection (cp mode only; the checks must then fail): --fault=scale
multiplies the softmax scale by 1.1; --fault=position uses each rank's local
row numbers as positions (what forgetting sharding.position_ids gives: wrong
only for documents split across ranks).
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from model import Corpus, DocumentAttention, Llama, add_model_args, learning_rate  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def import_hsap():
    try:
        import hsap.client  # noqa: F401 - the package and its generated hsap.v1 modules
    except ImportError:  # run from the source tree: sources + Bazel's generated modules
        sys.path[:0] = [os.path.join(REPO, "client", "python"),
                        os.path.join(REPO, "bazel-bin", "client", "python")]
        for name in [m for m in sys.modules if m == "hsap" or m.startswith("hsap.")]:
            del sys.modules[name]  # hsap.__path__ was computed without the generated tree
        import hsap.client  # noqa: F401
    import hsap
    return hsap


def autocast(dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=dtype)


def make_optimizer(model, lr):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def optimizer_step(model, opt, args, step):
    """Clips the gradient norm (--clip), sets this step's learning rate and
    steps AdamW."""
    if args.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for group in opt.param_groups:
        group["lr"] = learning_rate(args, step, args.steps)
    opt.step()


def save_checkpoint(path, model, opt, step, args):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "config": vars(args)}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, model, opt):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return state["step"]


class Recorder:
    """Per-step records, written as JSON by rank 0 / the reference."""

    def __init__(self, args, mode):
        self.args, self.mode = args, mode
        self.steps = []
        self.logits = {}

    def add(self, **record):
        self.steps.append(record)

    def write(self, extra):
        if self.args.out:
            with open(self.args.out, "w") as f:
                json.dump(dict(mode=self.mode, config=vars(self.args), steps=self.steps,
                               **extra), f, indent=1)
        if self.args.logits and self.logits:
            torch.save(self.logits, self.args.logits)


def check_steps(args):
    if args.check_steps:
        return {int(s) for s in args.check_steps.split(",")}
    return {1, args.steps} | set(range(10, args.steps + 1, 10))


def train_reference(args):
    dtype = DTYPES[args.dtype]
    corpus = Corpus(args, REPO)
    model = Llama(args, DocumentAttention())
    opt = make_optimizer(model, args.lr)
    start = load_checkpoint(args.resume, model, opt) if args.resume else 0
    rec = Recorder(args, "reference")
    checks = check_steps(args)
    print(f"reference: 1 process, {args.dtype}, {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, corpus {len(corpus.files)} files / {len(corpus.tokens):,} bytes, "
          f"{args.tokens} tokens a step", flush=True)
    for step in range(start, args.until or args.steps):
        ids, targets, cu, positions = corpus.batch(step)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast(dtype):
            logits = model(ids, positions, cu)
        loss = F.cross_entropy(logits, targets, ignore_index=-100)
        loss.backward()
        optimizer_step(model, opt, args, step)
        seconds = time.perf_counter() - t0
        if step + 1 in checks:
            rec.logits[step + 1] = logits.detach().clone()
        rec.add(step=step + 1, loss=loss.item(), seconds=seconds,
                tokens_per_s=args.tokens / seconds, documents=len(cu) - 1)
        print(f"ref  step {step + 1:>4}  loss {loss.item():.6f}  {args.tokens / seconds:>8.0f} "
              f"tokens/s  docs {len(cu) - 1}", flush=True)
        if args.save_at and step + 1 == args.save_at and args.checkpoint:
            save_checkpoint(args.checkpoint, model, opt, step + 1, args)
    rec.write({})


def all_reduce_gradients(model):
    """Sums every parameter's gradient over all processes (one flat all_reduce)."""
    import torch.distributed as dist
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    at = 0
    for g in grads:
        g.copy_(flat[at:at + g.numel()].view_as(g))
        at += g.numel()


class FaultyPositions:
    """--fault=position: the rank's local row numbers instead of per-document
    positions (the bug of a trainer that forgets sharding.position_ids)."""

    @staticmethod
    def of(sharding):
        return torch.arange(sharding.local_tokens, dtype=torch.int64)


def train_cp(args):
    hsap = import_hsap()
    import torch.distributed as dist
    dtype = DTYPES[args.dtype]
    group = hsap.init_from_env(deadline_ms=args.deadline_ms)
    pg_rank = dist.get_rank()
    say = print if pg_rank == 0 else (lambda *a, **k: None)
    corpus = Corpus(args, REPO)
    head_dim = args.dim // args.heads
    scale = 1.0 / math.sqrt(head_dim) * (1.1 if args.fault == "scale" else 1.0)
    attn = hsap.nn.ContextParallelAttention(group, causal=True, softmax_scale=scale,
                                            strategy=args.strategy)
    model = Llama(args, attn)
    opt = make_optimizer(model, args.lr)
    start = load_checkpoint(args.resume, model, opt) if args.resume else 0
    rec = Recorder(args, "cp")
    checks = check_steps(args)
    say(f"group {group.name}: {group.size} ranks on {group.num_nodes} daemons "
        f"{list(group.nodes)}; pg rank -> hsap rank "
        f"{[group.pg_ranks.index(r) for r in range(group.size)]}; {args.dtype}, strategy "
        f"{args.strategy}{', FAULT ' + args.fault if args.fault else ''}", flush=True)
    say(f"corpus {len(corpus.files)} files / {len(corpus.tokens):,} bytes, {args.tokens} tokens "
        f"a step; {sum(p.numel() for p in model.parameters()):,} parameters", flush=True)
    try:
        for step in range(start, args.until or args.steps):
            ids, targets, cu, _ = corpus.batch(step)
            t0 = time.perf_counter()
            attention_before = group.attention_seconds
            (ids_l, targets_l), sharding = hsap.shard(
                [ids, targets], cu, group, heads=args.heads, kv_heads=args.kv_heads,
                head_dim=head_dim, dtype=dtype, strategy=args.strategy)
            positions = (FaultyPositions.of(sharding) if args.fault == "position"
                         else sharding.position_ids)
            opt.zero_grad(set_to_none=True)
            with autocast(dtype):
                logits = model(ids_l, positions, sharding)
            local_sum = F.cross_entropy(logits, targets_l, ignore_index=-100, reduction="sum")
            counted = torch.tensor([float((targets_l != -100).sum()), local_sum.item()],
                                   dtype=torch.float64)
            dist.all_reduce(counted)
            (local_sum / counted[0]).backward()
            all_reduce_gradients(model)
            optimizer_step(model, opt, args, step)
            seconds = time.perf_counter() - t0
            attention = group.attention_seconds - attention_before
            loss = counted[1].item() / counted[0].item()
            if step + 1 in checks:
                full = hsap.unshard(logits.detach(), sharding)
                if pg_rank == 0:
                    rec.logits[step + 1] = full
            strategy = group.last_stats.strategy if group.last_stats is not None else 0
            rec.add(step=step + 1, loss=loss, seconds=seconds, tokens_per_s=args.tokens / seconds,
                    attention_seconds=attention, documents=len(cu) - 1,
                    local_tokens=sharding.local_tokens, strategy=int(strategy))
            say(f"cp   step {step + 1:>4}  loss {loss:.6f}  {args.tokens / seconds:>8.0f} tokens/s"
                f"  attention {100 * attention / seconds:>4.1f}%  step {seconds:.3f} s  docs "
                f"{len(cu) - 1}", flush=True)
            if args.save_at and step + 1 == args.save_at and args.checkpoint:
                if pg_rank == 0:
                    save_checkpoint(args.checkpoint, model, opt, step + 1, args)
                dist.barrier()
    finally:
        group.client.close()
    if pg_rank == 0:
        rec.write({"group": {"name": group.name, "nodes": list(group.nodes),
                             "pg_to_hsap": [group.pg_ranks.index(r) for r in range(group.size)]},
                   "calls_per_rank": group.call_seq})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("--mode", choices=("cp", "reference"), required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--fault", choices=("", "scale", "position"), default="")
    p.add_argument("--out", default="", help="per-step records (JSON)")
    p.add_argument("--logits", default="", help="logits of the check steps (torch.save)")
    p.add_argument("--check-steps", default="", help="steps whose logits are saved "
                   "(default: 1, every 10th, the last)")
    p.add_argument("--save-at", type=int, default=0, help="write a checkpoint after this step")
    p.add_argument("--checkpoint", default="", help="where --save-at writes")
    p.add_argument("--resume", default="", help="continue from this checkpoint")
    p.add_argument("--until", type=int, default=0,
                   help="stop after this step (default --steps; the schedule still spans --steps)")
    p.add_argument("--deadline-ms", type=int, default=120000)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    args = p.parse_args()
    if args.fault and args.mode != "cp":
        p.error("--fault applies to --mode=cp")
    torch.set_num_threads(max(1, args.threads))
    try:
        if args.mode == "reference":
            train_reference(args)
        else:
            train_cp(args)
        return 0
    except Exception:  # noqa: BLE001 - reported, then a failing exit status
        traceback.print_exc()
        print(f"rank {os.environ.get('RANK', '-')}: training failed", flush=True)
        return 1
    finally:
        if "torch.distributed" in sys.modules:
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

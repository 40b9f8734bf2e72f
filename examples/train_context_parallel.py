#!/usr/bin/python3
"""Context-parallel training under torchrun: every process holds only its own
tokens for the whole model, its attention computed by its node's hsapd as
one collective of all processes, and checks each step's loss against a
single-process reference.

    examples/run_context_parallel.sh            # 2 hsapd + 2 torchrun node ranks x 2

or by hand, with one hsapd per node (HSAP_SOCKET: its Unix socket):

    HSAP_SOCKET=/tmp/n0/hsapd.sock /usr/bin/python3 -m torch.distributed.run --nnodes=2 \\
        --node_rank=0 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=29500 \\
        examples/train_context_parallel.py
    (and --node_rank=1 with node 1's socket)

Each process: hsap.init_from_env() (init_process_group("gloo") from
torchrun's environment, a session with $HSAP_SOCKET's daemon, the group
formed over torch.distributed with hsap.Group.from_process_group). Every
step, the data loader's packed window (the corpus and model of
train_tiny_transformer.py: this repository's Python sources as bytes, 2
pre-LayerNorm blocks, d_model 128, 4 heads of 32) is laid out by
hsap.dispatch; the process keeps only its rows (group.rank's
layout.indices) and computes the embeddings, LayerNorms, projections, MLP and
loss on them alone. Attention runs through hsapd (hsap.varlen_attn with the
group: forward and backward are collectives of the 4 processes across both
daemons). The loss is the sum over local tokens divided by the global count,
so the gradients all-reduced (summed) over torch.distributed are the full
batch's; every process then takes the same Adam step.

Check: pg rank 0 also trains a single-process reference (the same initial
weights, the full sequence, plain masked attention with a float64 softmax)
and compares, at every step, the global loss (<= 1e-4 relative) and every
process's logits against the reference's rows (max |difference| / max
|logit| <= 1e-4: the sharp check, see train_tiny_transformer.py). Rank 0's
last line is CHECK PASSED or CHECK FAILED; every process exits 1 on failure.
"""

import argparse
import copy
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

try:
    import hsap.client  # noqa: F401 - the package and its generated hsap.v1 modules
except ImportError:  # run from the source tree: sources + Bazel's generated modules
    sys.path[:0] = [os.path.join(REPO, "client", "python"),
                    os.path.join(REPO, "bazel-bin", "client", "python")]
    for _name in [m for m in sys.modules if m == "hsap" or m.startswith("hsap.")]:
        del sys.modules[_name]  # hsap.__path__ was computed without the generated tree
    import hsap.client  # noqa: F401
import hsap  # noqa: E402
from train_tiny_transformer import (  # noqa: E402
    TinyTransformer, document_stream, packed_batch, python_sources, reference_attention)

TOLERANCE = 1e-4


def all_reduce_gradients(model):
    """Sums every parameter's gradient over the default group (one flat
    buffer, one all_reduce)."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def reference_step(reference, opt, x, pos, target, cu):
    opt.zero_grad()
    logits = reference(x, pos, lambda q, k, v: reference_attention(q, k, v, cu))
    loss = F.cross_entropy(logits, target, ignore_index=-100)
    loss.backward()
    opt.step()
    return loss.item(), logits.detach()


def train(args):
    group = hsap.init_from_env(deadline_ms=args.deadline_ms)
    rank, world = group.rank, group.size
    pg_rank = dist.get_rank()
    torch.manual_seed(args.seed)
    tokens, starts = document_stream(args.source_root, args.max_doc_len)
    model = TinyTransformer(max_positions=args.max_doc_len)
    for p in model.parameters():  # the same initial weights everywhere (as DDP does)
        dist.broadcast(p.data, src=0)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    reference = copy.deepcopy(model) if pg_rank == 0 else None
    ref_opt = torch.optim.Adam(reference.parameters(), lr=args.lr) if reference else None
    heads = model.blocks[0].heads
    head_dim = model.blocks[0].qkv.in_features // heads
    say = print if pg_rank == 0 else (lambda *a, **k: None)
    say(f"group {group.name}: {world} ranks on {group.num_nodes} daemons {list(group.nodes)}, "
        f"{group.ranks_per_node} per node; pg rank -> hsap rank "
        f"{[group.pg_ranks.index(r) for r in range(world)]}")
    say(f"corpus: {len(python_sources(args.source_root))} Python files, {len(tokens)} bytes; "
        f"{args.tokens} tokens a step, strategy {args.strategy}; reference: one process")
    say(f"{'step':>4} {'docs':>4} {'strategy':>9} {'tokens/rank':>15} {'loss':>10} "
        f"{'reference':>10} {'rel diff':>9} {'logit rel':>9} {'step s':>7}")
    worst = worst_logits = 0.0
    try:
        for step in range(args.steps):
            x, cu, pos, target = packed_batch(tokens, starts, step, args.tokens)
            max_seqlen = max(b - a for a, b in zip(cu[:-1], cu[1:]))
            layout = hsap.dispatch(cu, world, heads, heads, head_dim, torch.float32,
                                   args.strategy, group.assignment, nodes=group.num_nodes,
                                   client=group.client)
            rows = layout.indices(rank)
            # From here on this process sees only its own tokens.
            x_l, pos_l, target_l = x[rows], pos[rows], target[rows]

            t0 = time.monotonic()
            opt.zero_grad()
            logits = model(x_l, pos_l, lambda q, k, v: hsap.varlen_attn(
                q, k, v, cu, max_seqlen, causal=True, group=group, strategy=args.strategy))
            local_sum = F.cross_entropy(logits, target_l, ignore_index=-100, reduction="sum")
            counted = torch.tensor([float((target_l != -100).sum()), local_sum.item()],
                                   dtype=torch.float64)
            dist.all_reduce(counted)
            (local_sum / counted[0]).backward()
            all_reduce_gradients(model)
            opt.step()
            loss = counted[1].item() / counted[0].item()
            seconds = time.monotonic() - t0

            gathered = [None] * dist.get_world_size() if pg_rank == 0 else None
            dist.gather_object((rows, logits.detach()), gathered, dst=0)
            verdict = torch.zeros(2, dtype=torch.float64)
            if pg_rank == 0:
                ref_loss, ref_logits = reference_step(reference, ref_opt, x, pos, target, cu)
                rel = abs(loss - ref_loss) / abs(ref_loss)
                logit_diff = max((got - ref_logits[r]).abs().max().item() for r, got in gathered)
                logit_rel = logit_diff / ref_logits.abs().max().item()
                verdict[:] = torch.tensor([rel, logit_rel])
                flag = "" if max(rel, logit_rel) <= TOLERANCE else "  <-- exceeds 1e-4"
                counts = "/".join(str(len(r)) for r, _ in gathered)
                print(f"{step + 1:>4} {len(cu) - 1:>4} {layout.strategy:>9} {counts:>15} "
                      f"{loss:>10.6f} {ref_loss:>10.6f} {rel:>9.2e} {logit_rel:>9.2e} "
                      f"{seconds:>7.3f}{flag}", flush=True)
            dist.broadcast(verdict, src=0)
            worst = max(worst, verdict[0].item())
            worst_logits = max(worst_logits, verdict[1].item())
    finally:
        group.client.close()
    ok = worst <= TOLERANCE and worst_logits <= TOLERANCE
    say(f"{group.call_seq} collective attention calls per rank ({args.steps} steps x "
        f"{len(model.blocks)} layers x forward + backward); worst relative difference: loss "
        f"{worst:.2e}, logits {worst_logits:.2e} (tolerance {TOLERANCE})")
    say("CHECK PASSED" if ok else "CHECK FAILED", flush=True)
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source-root", default=REPO, help="repository root holding the corpus")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--tokens", type=int, default=1024, help="packed tokens per step")
    p.add_argument("--max-doc-len", type=int, default=384)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline-ms", type=int, default=60000,
                   help="every attention call's deadline (all ranks must arrive by then)")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    try:
        status = train(args)
    except Exception:  # noqa: BLE001 - reported, then the verdict
        traceback.print_exc()
        print(f"rank {os.environ.get('RANK')}: CHECK FAILED", flush=True)
        status = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch's flash attention on the packed sequence kernel_bench timed.

Run with the machine's python3 (PyTorch 2.x, a CUDA GPU):

  python3 tests/gpu/torch_flash_bench.py --cu_seqlens=FILE [--heads=16] [--head_dim=128]
      [--dtype=bf16] [--reps=20] [--dump_dir=DIR]

* Timing: the varlen flash kernels (torch.ops.aten._flash_attention_forward /
  _flash_attention_backward with cum_seq_q / cum_seq_k, causal) on the same
  cu_seqlens, random inputs, median of --reps CUDA-event timings after
  warm-up; useful FLOPs from the mask area exactly as kernel_bench counts
  them (forward 4*area*H*D, backward 10*area*H*D). If the varlen op is
  missing or its signature differs, falls back to one
  F.scaled_dot_product_attention call per document under
  sdpa_kernel(SDPBackend.FLASH_ATTENTION) (slower for torch: one launch per
  document) and says so.
* Accuracy (with --dump_dir from `kernel_bench --dump_dir`): on identical
  inputs, the error of our outputs and of torch's against a float64
  reference, each as max|x - ref| / max|ref| and as a ratio to the error of
  the float64 result rounded to the dtype (the yardstick of the C++ tests).

Output lines "TORCH kernel=..." and "ACCURACY ..." are parsed by
tests/gpu/device_check.sh.
"""

import argparse
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def varlen_forward(q, k, v, cu, max_len, scale):
    """(out, lse, philox_seed, philox_offset) from the aten varlen flash op."""
    res = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)
    return res[0], res[1], res[2], res[3]


def varlen_backward(dout, q, k, v, out, lse, cu, max_len, seed, offset, scale):
    res = torch.ops.aten._flash_attention_backward(
        dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, True, seed, offset, scale=scale)
    return res[0], res[1], res[2]


def per_document(q, k, v, cu_list, scale, dout=None):
    """Per-document flash SDPA; returns O and, with dout, (dQ, dK, dV)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    outs, grads = [], ([], [], [])
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for b, e in zip(cu_list[:-1], cu_list[1:]):
            if e == b:
                continue
            qs, ks, vs = (x[b:e].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if dout is not None:
                qs, ks, vs = (x.detach().requires_grad_() for x in (qs, ks, vs))
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
            outs.append(o.squeeze(0).transpose(0, 1))
            if dout is not None:
                o.backward(dout[b:e].transpose(0, 1).unsqueeze(0))
                for acc, x in zip(grads, (qs, ks, vs)):
                    acc.append(x.grad.squeeze(0).transpose(0, 1))
    out = torch.cat(outs)
    if dout is None:
        return out
    return out, tuple(torch.cat(g) for g in grads)


def reference(q, k, v, dout, cu_list, scale):
    """float64 O, dQ, dK, dV per causal document (autograd on the CPU-free path)."""
    q64, k64, v64 = (x.double().detach().requires_grad_() for x in (q, k, v))
    outs = []
    for b, e in zip(cu_list[:-1], cu_list[1:]):
        if e == b:
            continue
        qs, ks, vs = (x[b:e].transpose(0, 1) for x in (q64, k64, v64))  # [H, L, D]
        s = torch.matmul(qs, ks.transpose(1, 2)) * scale
        mask = torch.ones(e - b, e - b, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        outs.append(torch.matmul(torch.softmax(s, dim=-1), vs).transpose(0, 1))
    out = torch.cat(outs)
    out.backward(dout.double())
    return out.detach(), q64.grad, k64.grad, v64.grad


def rel_error(x, ref):
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def yardstick(ref, dtype):
    return max(rel_error(ref.to(dtype), ref), 1e-5)


def accuracy(args, dtype, scale, use_varlen):
    d = args.dump_dir
    cu_list = [int(x) for x in open(os.path.join(d, "cu_seqlens.txt")).read().strip().split(",")]
    T, H, D = cu_list[-1], args.heads, args.head_dim

    def load(name):
        raw = bytearray(open(os.path.join(d, name), "rb").read())
        return torch.frombuffer(raw, dtype=dtype).view(T, H, D).cuda()

    q, k, v, dout = (load(n) for n in ("q.bin", "k.bin", "v.bin", "dout.bin"))
    ours = {n: load(n + ".bin") for n in ("o", "dq", "dk", "dv")}
    ref = dict(zip(("o", "dq", "dk", "dv"), reference(q, k, v, dout, cu_list, scale)))
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    max_len = max(e - b for b, e in zip(cu_list[:-1], cu_list[1:]))
    if use_varlen:
        out, lse, seed, offset = varlen_forward(q, k, v, cu, max_len, scale)
        dq, dk, dv = varlen_backward(dout, q, k, v, out, lse, cu, max_len, seed, offset, scale)
    else:
        out, (dq, dk, dv) = per_document(q, k, v, cu_list, scale, dout)
    torch_out = {"o": out, "dq": dq, "dk": dk, "dv": dv}
    for name in ("o", "dq", "dk", "dv"):
        y = yardstick(ref[name], dtype)
        e_ours, e_torch = rel_error(ours[name], ref[name]), rel_error(torch_out[name], ref[name])
        print(f"ACCURACY tensor={name} T={T} ours_err={e_ours:.3e} torch_err={e_torch:.3e} "
              f"rounding={y:.3e} ours_over_rounding={e_ours / y:.3f} "
              f"torch_over_rounding={e_torch / y:.3f} ours_over_torch={e_ours / e_torch:.3f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cu_seqlens", required=True)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--dump_dir", default="")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("torch_flash_bench: no GPU visible to PyTorch", file=sys.stderr)
        return 3
    dtype = DTYPES[args.dtype]
    cu_list = [int(x) for x in open(args.cu_seqlens).read().strip().split(",")]
    T, H, D = cu_list[-1], args.heads, args.head_dim
    scale = 1.0 / math.sqrt(D)
    area = sum((e - b) * (e - b + 1) // 2 for b, e in zip(cu_list[:-1], cu_list[1:]))
    max_len = max(e - b for b, e in zip(cu_list[:-1], cu_list[1:]))
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    def rand():
        return (torch.rand(T, H, D, device="cuda", generator=gen) * 2 - 1).to(dtype)

    q, k, v, dout = rand(), rand(), rand(), rand()
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; T={T} "
          f"documents={len(cu_list) - 1} longest={max_len} area={area}")

    use_varlen = True
    try:
        out, lse, seed, offset = varlen_forward(q, k, v, cu, max_len, scale)
        varlen_backward(dout, q, k, v, out, lse, cu, max_len, seed, offset, scale)
    except Exception as e:  # op missing or signature changed in this version
        print(f"torch_flash_bench: varlen op failed ({type(e).__name__}: {e}); "
              "falling back to per-document SDPA flash", file=sys.stderr)
        use_varlen = False

    if use_varlen:
        fwd_ms = median_ms(lambda: varlen_forward(q, k, v, cu, max_len, scale), args.reps)
        out, lse, seed, offset = varlen_forward(q, k, v, cu, max_len, scale)
        bwd_ms = median_ms(
            lambda: varlen_backward(dout, q, k, v, out, lse, cu, max_len, seed, offset, scale),
            args.reps)
        how = "varlen"
    else:
        fwd_ms = median_ms(lambda: per_document(q, k, v, cu_list, scale), args.reps)
        both_ms = median_ms(lambda: per_document(q, k, v, cu_list, scale, dout), args.reps)
        bwd_ms = max(both_ms - fwd_ms, 1e-6)
        how = "per-document-sdpa"
    fwd_flops, bwd_flops = 4.0 * area * H * D, 10.0 * area * H * D
    print(f"TORCH kernel=fwd how={how} dtype={args.dtype} D={D} H={H} T={T} "
          f"tflops={fwd_flops / fwd_ms / 1e9:.1f} ms={fwd_ms:.3f}")
    print(f"TORCH kernel=bwd how={how} dtype={args.dtype} D={D} H={H} T={T} "
          f"tflops={bwd_flops / bwd_ms / 1e9:.1f} ms={bwd_ms:.3f}")
    if args.dump_dir:
        accuracy(args, dtype, scale, use_varlen)
    return 0


if __name__ == "__main__":
    sys.exit(main())

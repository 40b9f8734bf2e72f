"""A plain PyTorch reference of varlen attention (dense masked softmax), for
tests and for checking the daemon: differentiable, any float dtype (use
float64 for a reference).

    out, lse = hsap.reference.varlen_attn_reference(q, k, v, cu_seqlens)

q: [T, Hq, D]; k, v: [T, Hkv, D] over the whole (global) sequence;
cu_seqlens: document boundaries. Query i sees key j iff both lie in the same
document and, when causal, j <= i (and i - j <= window_left when >= 0).
Returns out [T, Hq, D] and lse [Hq, T]; rows that see no key get out = 0 and
lse = -inf, as hsapd does. Memory is O(Hq * T^2): for tests, not training.
"""

import math

import torch


def document_mask(cu_seqlens, causal=True, window_left=-1, device=None):
    """Bool [T, T]: entry (i, j) is True when query i may see key j."""
    cu = [int(x) for x in cu_seqlens]
    total = cu[-1]
    doc = torch.zeros(total, dtype=torch.int64, device=device)
    for i in range(len(cu) - 1):
        doc[cu[i]:cu[i + 1]] = i
    allowed = doc[:, None] == doc[None, :]
    if causal:
        pos = torch.arange(total, device=device)
        dist = pos[:, None] - pos[None, :]
        allowed &= dist >= 0
        if window_left >= 0:
            allowed &= dist <= window_left
    return allowed


def varlen_attn_reference(q, k, v, cu_seqlens, softmax_scale=None, causal=True, window_left=-1):
    t, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    rep = hq // hkv
    kk = k.repeat_interleave(rep, dim=1)  # [T, Hq, D]
    vv = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, kk) * scale  # [Hq, T, T]
    allowed = document_mask(cu_seqlens, causal, window_left, q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, T]
    finite = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(finite, lse, torch.zeros_like(lse))[..., None])
    probs = torch.where(allowed, probs, torch.zeros_like(probs))
    out = torch.einsum("hij,jhd->ihd", probs, vv)
    return out, lse

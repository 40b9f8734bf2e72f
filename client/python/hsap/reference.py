"""Plain PyTorch references of the attention hsapd computes (dense masked
softmax), for tests and for checking the daemon: differentiable, any float
dtype (use float64 for a reference). Memory is O(Hq * Tq * Tk): for tests,
not training.

    out, lse = hsap.reference.varlen_attn_reference(q, k, v, cu_seqlens)
    out, lse = hsap.reference.flash_varlen_reference(q, k, v, cu_q, cu_k, causal, (l, r))
    out, lse = hsap.reference.masked_reference(q, k, v, allowed)   # allowed: bool [Tq, Tk]

q: [Tq, Hq, D]; k, v: [Tk, Hkv, D] over the whole (global) sequence. Returns
out [Tq, Hq, D] and lse [Hq, Tq]; rows that see no key get out = 0 and
lse = -inf, as hsapd does. The masks here are built from their definitions
(flash-attention's docstring rule), not from hsap.masks' slice lowering, so
tests compare two independent derivations.
"""

import math

import torch


def document_mask(cu_seqlens, causal=True, window_left=-1, device=None):
    """Bool [T, T]: entry (i, j) is True when query i may see key j: same
    document and, when causal, j <= i (and i - j <= window_left when >= 0)."""
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


def flash_varlen_mask(cu_seqlens_q, cu_seqlens_k, causal=False, window_size=(-1, -1),
                      device=None):
    """Bool [Tq, Tk] of flash-attention's varlen rule: in document b (Lq
    queries, Lk keys, s = Lk - Lq), query i sees key j iff j <= i + s when
    causal, and j in [i + s - left, i + s + right] for the window sides that
    are not -1. `causal` may be one flag per document."""
    cu_q = [int(x) for x in cu_seqlens_q]
    cu_k = [int(x) for x in cu_seqlens_k]
    left, right = (int(x) for x in window_size)
    docs = len(cu_q) - 1
    flags = list(causal) if isinstance(causal, (list, tuple)) else [bool(causal)] * docs
    allowed = torch.zeros(cu_q[-1], cu_k[-1], dtype=torch.bool, device=device)
    for b in range(docs):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if lq == 0 or lk == 0:
            continue
        i = torch.arange(lq, device=device)[:, None]
        j = torch.arange(lk, device=device)[None, :]
        s = lk - lq
        block = torch.ones(lq, lk, dtype=torch.bool, device=device)
        is_causal = flags[b] if not isinstance(flags[b], str) else flags[b] == "causal"
        if is_causal:
            block &= j <= i + s
        if left >= 0:
            block &= j >= i + s - left
        if right >= 0:
            block &= j <= i + s + right
        allowed[cu_q[b]:cu_q[b + 1], cu_k[b]:cu_k[b + 1]] = block
    return allowed


def masked_reference(q, k, v, allowed, softmax_scale=None):
    """Dense attention of q [Tq, Hq, D] over k, v [Tk, Hkv, D] where query i
    sees key j iff allowed[i, j] (bool [Tq, Tk])."""
    _, hq, d = q.shape
    hkv = k.shape[1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    rep = hq // hkv
    kk = k.repeat_interleave(rep, dim=1)  # [Tk, Hq, D]
    vv = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, kk) * scale  # [Hq, Tq, Tk]
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, Tq]
    finite = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(finite, lse, torch.zeros_like(lse))[..., None])
    probs = torch.where(allowed, probs, torch.zeros_like(probs))
    out = torch.einsum("hij,jhd->ihd", probs, vv)
    return out, lse


def varlen_attn_reference(q, k, v, cu_seqlens, softmax_scale=None, causal=True, window_left=-1):
    """Packed documents (hsap.varlen_attn's mask), q, k, v [T, H, D]."""
    allowed = document_mask(cu_seqlens, causal, window_left, q.device)
    return masked_reference(q, k, v, allowed, softmax_scale)


def flash_varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False,
                           window_size=(-1, -1), softmax_scale=None):
    """flash_attn_varlen_func's result, densely: q [Tq, Hq, D], k, v [Tk, Hkv, D]."""
    allowed = flash_varlen_mask(cu_seqlens_q, cu_seqlens_k, causal, window_size, q.device)
    return masked_reference(q, k, v, allowed, softmax_scale)

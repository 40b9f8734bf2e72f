"""flash-attention 2's varlen API, computed exactly by hsapd: a trainer
switches by changing one import.

    # from flash_attn import flash_attn_varlen_func
    from hsap import flash_attn_varlen_func
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, causal=True)

The signatures, defaults and return conventions are flash-attention's
(flash_attn/flash_attn_interface.py, 2.x): `return_attn_probs=True` returns
(out, softmax_lse, None) — there is no attention-probability tensor, as
flash-attention's own is "for testing only". Added, keyword-only: `group=`
(an hsap.Group: a sequence-parallel group of several ranks, each passing its
local rows laid out by hsap.dispatch), `strategy=` ("auto", "ring",
"allgather", "ulysses", "usp", "sap", "hsap") and `client=`.

Arguments with no exact meaning here are refused with InvalidInputError
naming them: dropout_p != 0, softcap != 0, alibi_slopes, block_table.
deterministic is accepted (hsapd's outputs are always bitwise
deterministic). Every other case flash-attention's tests use runs: any head
dim in [1, 256], query and key documents of different lengths (bottom-right
causal alignment), windows (left, right) with either side unlimited, causal
or not, GQA/MQA. Differences: LSE is -inf (not +inf) for rows that see no
key; CPU tensors in fp32 too.
"""

from hsap import masks
from hsap.attention import attend, check_max_seqlen, check_tensors, cu_seqlens_list
from hsap.errors import InvalidInputError


def _refuse_unsupported(dropout_p, softcap, alibi_slopes, block_table=None):
    try:
        dropout = float(dropout_p)
    except (TypeError, ValueError):
        raise InvalidInputError(f"dropout_p is {dropout_p!r}; it must be 0.0") from None
    if dropout != 0.0:
        raise InvalidInputError(f"dropout_p is {dropout_p!r}: hsapd computes exact attention "
                                "and implements no attention dropout; pass dropout_p=0.0")
    try:
        cap = float(softcap)
    except (TypeError, ValueError):
        raise InvalidInputError(f"softcap is {softcap!r}; it must be 0.0") from None
    if cap != 0.0:
        raise InvalidInputError(f"softcap is {softcap!r}: logit softcapping is not implemented "
                                "by hsapd; pass softcap=0.0")
    if alibi_slopes is not None:
        raise InvalidInputError("alibi_slopes is given: ALiBi biases are not implemented by "
                                "hsapd; pass alibi_slopes=None")
    if block_table is not None:
        raise InvalidInputError("block_table is given: paged KV caches are not supported by "
                                "hsapd; pass block_table=None")


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_size, return_attn_probs, group, strategy, client, names,
            cu_names=("cu_seqlens_q", "cu_seqlens_k"), max_names=("max_seqlen_q", "max_seqlen_k")):
    check_tensors(q, k, v, names)
    cu_q = cu_seqlens_list(cu_seqlens_q, cu_names[0])
    cu_k = cu_q if cu_seqlens_k is None else cu_seqlens_list(cu_seqlens_k, cu_names[1])
    size = 1 if group is None else group.size
    qn, kn, _ = names
    if size == 1:
        if q.shape[0] != cu_q[-1]:
            raise InvalidInputError(f"{cu_names[0]} ends at {cu_q[-1]} but {qn} has "
                                    f"{q.shape[0]} tokens (a one-rank group holds every token: "
                                    "they must be equal)")
        if k.shape[0] != cu_k[-1]:
            raise InvalidInputError(f"{cu_names[1]} ends at {cu_k[-1]} but {kn} has "
                                    f"{k.shape[0]} tokens (a one-rank group holds every token: "
                                    "they must be equal)")
    check_max_seqlen(max_seqlen_q, cu_q, max_names[0], cu_names[0])
    check_max_seqlen(max_seqlen_k, cu_k, max_names[1], cu_names[1])
    mask = masks.varlen(cu_q, cu_k, bool(causal), window_size)
    out, lse = attend(q, k, v, mask, softmax_scale, group, strategy, client, names)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, group=None,
                           strategy="auto", client=None):
    """flash_attn.flash_attn_varlen_func through hsapd.

    q: [total_q, nheads, headdim]; k, v: [total_k, nheads_k, headdim]
      (nheads % nheads_k == 0, 1 <= headdim <= 256), float32/bfloat16/float16.
    cu_seqlens_q, cu_seqlens_k: [batch + 1] int32/int64 (tensor or list), the
      documents of q and of k; document b's queries see its keys, causally
      with the bottom-right alignment when causal (j <= i + Lk - Lq), within
      [i + Lk - Lq - left, i + Lk - Lq + right] when window_size = (left,
      right) (-1 = unlimited; causal means right = 0).
    max_seqlen_q, max_seqlen_k: at least the longest document (checked).
    dropout_p, softcap, alibi_slopes, block_table: must be off (refused).
    deterministic: accepted; outputs are always deterministic.
    Returns out [total_q, nheads, headdim], or with return_attn_probs
      (out, softmax_lse [nheads, total_q] float32, None).
    With group= of several ranks: q, k, v are this rank's rows (the same rows
      for all three; hsap.dispatch(hsap.masks.varlen(cu_seqlens_q,
      cu_seqlens_k, causal, window_size), ...) lays them out), and
      cu_seqlens_q[-1] must equal cu_seqlens_k[-1].
    """
    _refuse_unsupported(dropout_p, softcap, alibi_slopes, block_table)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_size, return_attn_probs, group, strategy,
                   client, ("q", "k", "v"))


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, group=None, strategy="auto",
                                    client=None):
    """flash_attn.flash_attn_varlen_kvpacked_func through hsapd: kv is
    [total_k, 2, nheads_k, headdim] (K then V); the gradient reaches kv.
    Otherwise as flash_attn_varlen_func."""
    _refuse_unsupported(dropout_p, softcap, alibi_slopes)
    if not hasattr(kv, "dim") or kv.dim() != 4 or kv.shape[1] != 2:
        shape = list(kv.shape) if hasattr(kv, "shape") else type(kv).__name__
        raise InvalidInputError(f"kv has shape {shape}; it must be [total_k, 2, nheads_k, "
                                "headdim]")
    k, v = kv.unbind(1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_size, return_attn_probs, group, strategy,
                   client, ("q", "kv[:, 0]", "kv[:, 1]"))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, group=None, strategy="auto",
                                     client=None):
    """flash_attn.flash_attn_varlen_qkvpacked_func through hsapd: qkv is
    [total, 3, nheads, headdim] (Q, K, V; the same heads for all three); the
    gradient reaches qkv. Otherwise as flash_attn_varlen_func with
    cu_seqlens_q = cu_seqlens_k = cu_seqlens."""
    _refuse_unsupported(dropout_p, softcap, alibi_slopes)
    if not hasattr(qkv, "dim") or qkv.dim() != 4 or qkv.shape[1] != 3:
        shape = list(qkv.shape) if hasattr(qkv, "shape") else type(qkv).__name__
        raise InvalidInputError(f"qkv has shape {shape}; it must be [total, 3, nheads, headdim]")
    q, k, v = qkv.unbind(1)
    return _varlen(q, k, v, cu_seqlens, None, max_seqlen, max_seqlen, softmax_scale, causal,
                   window_size, return_attn_probs, group, strategy, client,
                   ("qkv[:, 0]", "qkv[:, 1]", "qkv[:, 2]"), ("cu_seqlens", "cu_seqlens"),
                   ("max_seqlen", "max_seqlen"))

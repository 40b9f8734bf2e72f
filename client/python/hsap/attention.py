"""hsap.masked_attn and hsap.varlen_attn: exact attention through hsapd,
differentiable. flash-attention's signatures are in hsap.flash (built on
these).

    out = hsap.masked_attn(q, k, v, mask)          # mask: hsap.masks.Mask
    out, lse = hsap.masked_attn(q, k, v, mask, return_lse=True)
    out = hsap.varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True)
    out.backward(grad)                              # Attention.Backward on the daemon

Tensors (DESIGN.md §4):
    q, out: [Tq, Hq, D]    k, v: [Tk, Hkv, D] (Hq % Hkv == 0, 1 <= D <= 256)
    lse: [Hq, Tq] float32  dtype float32, bfloat16 or float16 (the same for
    q, k, v), CPU, any strides (copied into shared memory unless they live in
    it already: Client.empty).
A one-rank group (group=None) passes every row: Tq = mask.num_q and Tk =
mask.num_k, which may differ. A group of several ranks holds one token space
(mask.num_q == mask.num_k); each rank passes its local rows as laid out by
hsap.dispatch (the same rows of q, k and v).

Query and key counts that differ (one-rank groups): hsapd's token space has
as many query as key rows, so the call runs over T = max(Tq, Tk) rows, the
shorter side padded with zero rows that no slice covers (they see no key /
are seen by no query: exact, and their outputs are dropped). Cost: the
arena holds T rows of Q, K, V, O, LSE (and dO, dQ, dK, dV in backward)
instead of Tq or Tk of each.

Validation happens here first — dtypes, shapes, the mask against the
tensors, strategy — and raises hsap.InvalidInputError (a ValueError; a dtype
problem is InvalidDTypeError, also a TypeError) naming the argument; what
only the daemon can check (this rank's share of the dispatch, limits) comes
back as hsap.HsapError with the daemon's code and message, naming the
daemon's socket, the group and the rank (hsap.client: the calls' deadlines).

Data path: each call checks out an arena (a registered memfd region, reused
across calls), copies q/k/v in (one copy each, straight into the shared
pages) unless they already live in shared memory (Client.empty: referenced in
place), the daemon writes O and LSE there, and they are copied out into
ordinary tensors, which autograd saves for the backward call (the daemon
keeps no state between calls: Backward carries O and LSE).
"""

import math
import time

import torch

from hsap import masks
from hsap.client import default_client
from hsap.errors import HsapError, InvalidDTypeError, InvalidInputError
from hsap.groups import solo_group
from hsap.v1 import attention_pb2
from hsap.v1 import common_pb2

STRATEGIES = {
    "auto": common_pb2.STRATEGY_AUTO,
    "ring": common_pb2.STRATEGY_RING,
    "allgather": common_pb2.STRATEGY_ALLGATHER,
    "ulysses": common_pb2.STRATEGY_ULYSSES,
    "usp": common_pb2.STRATEGY_USP,
    "sap": common_pb2.STRATEGY_SAP,
    "hsap": common_pb2.STRATEGY_HSAP,
}

ASSIGNMENTS = {
    "balanced": common_pb2.ASSIGNMENT_BALANCED,
    "contiguous": common_pb2.ASSIGNMENT_CONTIGUOUS,
    "zigzag": common_pb2.ASSIGNMENT_ZIGZAG,
}

DTYPES = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
    torch.float16: common_pb2.DTYPE_FLOAT16,
}

MAX_HEAD_DIM = 256

cu_seqlens_list = masks.cu_seqlens_values


def strategy_enum(strategy):
    """The proto Strategy for a name such as "auto" or "hsap"."""
    key = strategy.lower() if isinstance(strategy, str) else strategy
    if key not in STRATEGIES:
        raise InvalidInputError(
            f"unknown strategy {strategy!r}; it must be one of {', '.join(STRATEGIES)}")
    return STRATEGIES[key]


def assignment_enum(assignment):
    key = assignment.lower() if isinstance(assignment, str) else assignment
    if key not in ASSIGNMENTS:
        raise InvalidInputError(
            f"unknown assignment {assignment!r}; it must be one of {', '.join(ASSIGNMENTS)}")
    return ASSIGNMENTS[key]


def check_tensors(q, k, v, names=("q", "k", "v")):
    """dtypes, device and shapes of q [Tq, Hq, D], k and v [Tk, Hkv, D]."""
    qn, kn, vn = names
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"{name} is a {type(t).__name__}; it must be a torch.Tensor")
    if q.dtype not in DTYPES:
        raise InvalidDTypeError(f"{qn}.dtype is {q.dtype}; it must be torch.float32, "
                                "torch.bfloat16 or torch.float16")
    for name, t in ((kn, k), (vn, v)):
        if t.dtype != q.dtype:
            raise InvalidDTypeError(f"{name}.dtype is {t.dtype} but {qn}.dtype is {q.dtype}; "
                                    "q, k and v must have the same dtype")
    for name, t in zip(names, (q, k, v)):
        if t.device.type != "cpu":
            raise InvalidInputError(f"{name} is on {t.device}; this client passes CPU tensors "
                                    "(memfd regions)")
        if t.dim() != 3:
            raise InvalidInputError(f"{name} has shape {list(t.shape)}; it must be 3-D "
                                    f"[tokens, heads, head_dim]")
    _, hq, d = q.shape
    if k.shape[2] != d:
        raise InvalidInputError(f"{kn}.shape is {list(k.shape)} but {qn}.shape is "
                                f"{list(q.shape)}: k must be [tokens, Hkv, {d}]")
    if v.shape != k.shape:
        raise InvalidInputError(f"{vn}.shape is {list(v.shape)} but {kn}.shape is "
                                f"{list(k.shape)}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise InvalidInputError(f"head_dim ({qn}.shape[2]) is {d}; it must be in [1, "
                                f"{MAX_HEAD_DIM}]")
    hkv = k.shape[1]
    if hkv < 1 or hq % hkv != 0:
        raise InvalidInputError(f"k has {hkv} heads but q has {hq}: Hq must be a multiple of Hkv")


def scale_value(softmax_scale):
    """The proto softmax_scale: 0 for None (1/sqrt(D) on the daemon)."""
    if softmax_scale is None:
        return 0.0
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidInputError(f"softmax_scale is {softmax_scale!r}; it must be finite and > 0 "
                                "(None = 1/sqrt(head_dim))")
    return scale


class _Call:
    """Everything of one call but the tensors: the collective, the mask, the
    options and the token space (the same for its forward and backward).
    rows: rows of the daemon's token space on this rank; q_rows / k_rows:
    how many of them hold the caller's queries / keys (the rest is padding)."""

    def __init__(self, client, group, mask_spec, options, rows, q_rows, k_rows):
        self.client = client
        self.group = group
        self.mask = mask_spec
        self.options = options
        self.rows = rows
        self.q_rows = q_rows
        self.k_rows = k_rows

    def call_id(self, call_seq):
        return common_pb2.CallId(group=self.group.name, rank=self.group.rank,
                                 group_size=self.group.size, call_seq=call_seq,
                                 nodes=self.group.nodes or (),
                                 node_index=self.group.node_index)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _ref(region, offset, shape, dtype):
    return common_pb2.TensorRef(region_id=region.region_id, offset=offset, shape=list(shape),
                                dtype=DTYPES.get(dtype, common_pb2.DTYPE_FLOAT32))


def _stage(call, inputs, outputs):
    """Places one call's tensors. inputs: (name, tensor, shape, row_axis,
    fill): the daemon sees `shape`; the tensor fills its leading rows along
    row_axis and `fill` the rest. An input that needs no padding and lies in
    a region of the client's (Client.empty) is referenced in place; the
    others are copied into an arena checked out for the call. outputs:
    (name, shape, dtype) get arena space. Returns (arena, refs by name,
    views by name); REQUIRES: checkin_arena(arena) after the call."""
    client = call.client
    refs, specs, copies = {}, [], []
    for name, tensor, shape, row_axis, fill in inputs:
        found = None
        if tuple(tensor.shape) == tuple(shape) and tensor.is_contiguous():
            found = client.locate(tensor)
        if found is not None:
            region, offset = found
            refs[name] = _ref(region, offset, shape, tensor.dtype)
        else:
            specs.append((name, tuple(shape), tensor.dtype))
            copies.append((name, tensor, row_axis, fill))
    specs += outputs
    offsets, at = {}, 0
    for name, shape, dtype in specs:
        offsets[name] = (at, shape, dtype)
        at += (_numel(shape) * torch.empty((), dtype=dtype).element_size() + 63) // 64 * 64
    try:
        arena = client.checkout_arena(max(at, 64))
    except HsapError as e:  # registering a region for the call: name the call's group
        raise e.in_group(call.group.name, call.group.rank)
    region = arena.region
    views = {n: region.view(off, shape, dt) for n, (off, shape, dt) in offsets.items()}
    for name, tensor, row_axis, fill in copies:
        view = views[name]
        n = tensor.shape[row_axis]
        view.narrow(row_axis, 0, n).copy_(tensor)
        if n < view.shape[row_axis]:
            view.narrow(row_axis, n, view.shape[row_axis] - n).fill_(fill)
        client.copied_bytes += tensor.numel() * tensor.element_size()
    for n, (off, shape, dt) in offsets.items():
        refs[n] = _ref(region, off, shape, dt)
    return arena, refs, views


def _release_unanswered(call, arena, error):
    """None after abandoning `arena` when the daemon did not answer the call
    (it may still write O/LSE or the gradients there), else `arena`."""
    if error.no_answer:
        call.client.abandon_arena(arena)
        return None
    return arena


def _run_forward(call, q, k, v):
    """O [Tq, Hq, D] and LSE [Hq, Tq] (float32) of one forward call."""
    started = time.perf_counter()
    call.group.check_usable()  # a failed group refuses before staging touches the daemon
    rows, hq, d = call.rows, q.shape[1], q.shape[2]
    hkv = k.shape[1]
    arena, refs, views = _stage(
        call, [("q", q, (rows, hq, d), 0, 0.0), ("k", k, (rows, hkv, d), 0, 0.0),
               ("v", v, (rows, hkv, d), 0, 0.0)],
        [("o", (rows, hq, d), q.dtype), ("lse", (hq, rows), torch.float32)])
    try:
        def submit(call_seq):
            return call.client.forward(attention_pb2.AttentionForwardRequest(
                call=call.call_id(call_seq), mask=call.mask, options=call.options,
                q=refs["q"], k=refs["k"], v=refs["v"], o=refs["o"], lse=refs["lse"]))

        response = call.group.run(submit)
        out = views["o"][:call.q_rows].clone(), views["lse"][:, :call.q_rows].clone()
        call.group.note_call(time.perf_counter() - started, response.stats)
        return out
    except HsapError as e:
        arena = _release_unanswered(call, arena, e)
        raise
    finally:
        if arena is not None:
            call.client.checkin_arena(arena)


def _run_backward(call, q, k, v, o, lse, d_o):
    """dQ, dK, dV of one backward call (shapes and dtype of q, k, v)."""
    started = time.perf_counter()
    call.group.check_usable()
    rows, hq, d = call.rows, q.shape[1], q.shape[2]
    hkv = k.shape[1]
    qs, ks = (rows, hq, d), (rows, hkv, d)
    arena, refs, views = _stage(
        call, [("q", q, qs, 0, 0.0), ("k", k, ks, 0, 0.0), ("v", v, ks, 0, 0.0),
               ("o", o, qs, 0, 0.0), ("lse", lse, (hq, rows), 1, float("-inf")),
               ("d_o", d_o, qs, 0, 0.0)],
        [("dq", qs, q.dtype), ("dk", ks, k.dtype), ("dv", ks, v.dtype)])
    try:
        def submit(call_seq):
            return call.client.backward(attention_pb2.AttentionBackwardRequest(
                call=call.call_id(call_seq), mask=call.mask, options=call.options,
                q=refs["q"], k=refs["k"], v=refs["v"], o=refs["o"], lse=refs["lse"],
                d_o=refs["d_o"], dq=refs["dq"], dk=refs["dk"], dv=refs["dv"]))

        response = call.group.run(submit)
        grads = (views["dq"][:call.q_rows].clone(), views["dk"][:call.k_rows].clone(),
                 views["dv"][:call.k_rows].clone())
        call.group.note_call(time.perf_counter() - started, response.stats)
        return grads
    except HsapError as e:
        arena = _release_unanswered(call, arena, e)
        raise
    finally:
        if arena is not None:
            call.client.checkin_arena(arena)


class AttentionFunction(torch.autograd.Function):
    """forward: Attention.Forward, saves q, k, v, O, LSE; backward:
    Attention.Backward with them and dO. LSE is an output without gradient."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        o, lse = _run_forward(call, q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.call = call
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, _d_lse):
        q, k, v, o, lse = ctx.saved_tensors
        d_o = d_o.to(q.dtype)
        dq, dk, dv = _run_backward(ctx.call, q, k, v, o, lse, d_o)
        return dq, dk, dv, None


def resolve(group, client):
    """(client, group) of a call: client defaults to group.client, else
    hsap.default_client(); group None is the client's one-rank group."""
    if client is None:
        client = group.client if group is not None and group.client is not None else default_client()
    if group is None:
        group = solo_group(client)
    return client, group


def attend(q, k, v, mask, softmax_scale=None, group=None, strategy="auto", client=None,
           names=("q", "k", "v")):
    """The call behind every public function: (out [Tq, Hq, D], lse [Hq, Tq]).
    REQUIRES: check_tensors(q, k, v) passed; mask an hsap.masks.Mask."""
    qn, kn, _ = names
    size = 1 if group is None else group.size
    tq, tk = q.shape[0], k.shape[0]
    if size == 1:
        if tq != mask.num_q:
            raise InvalidInputError(f"{qn} has {tq} tokens but the mask has {mask.num_q} query "
                                    "rows (a one-rank group holds every token)")
        if tk != mask.num_k:
            raise InvalidInputError(f"{kn} has {tk} tokens but the mask has {mask.num_k} key "
                                    "rows (a one-rank group holds every token)")
        rows = max(tq, tk)
        spec = mask.mask_spec(rows)
    else:
        if not mask.is_square:
            raise InvalidInputError(
                f"the mask has {mask.num_q} query rows but {mask.num_k} key rows: a group of "
                f"{size} ranks holds one token space in which each token has a query and a key "
                "row; query and key documents of different total lengths run on one-rank "
                "groups only (group=None)")
        if tq != tk:
            raise InvalidInputError(f"{qn} has {tq} tokens but {kn} has {tk}: in a group of "
                                    f"{size} ranks each rank passes the same rows of q, k and v")
        if tq > mask.num_q:
            raise InvalidInputError(f"{qn} has {tq} tokens but the mask covers only "
                                    f"{mask.num_q}")
        rows = tq
        spec = mask.mask_spec()
    scale = scale_value(softmax_scale)
    strategy_value = strategy_enum(strategy)
    client, group = resolve(group, client)
    options = attention_pb2.CallOptions(softmax_scale=scale, strategy=strategy_value,
                                        assignment=assignment_enum(group.assignment),
                                        deadline_ms=group.deadline_ms)
    call = _Call(client, group, spec, options, rows, tq, tk)
    return AttentionFunction.apply(q, k, v, call)


def masked_attn(q, k, v, mask, softmax_scale=None, group=None, strategy="auto",
                return_lse=False, client=None):
    """Exact attention of q over k, v under `mask` (an hsap.masks.Mask:
    documents, flash-attention varlen, shared prefixes, MagiAttention
    ranges, explicit slices), computed by hsapd.

    q: [Tq, Hq, D]; k, v: [Tk, Hkv, D], float32/bfloat16/float16, CPU. A
      one-rank group passes all mask.num_q query and mask.num_k key rows; a
      group of several ranks its local rows (hsap.dispatch(mask, ...)).
    softmax_scale: None = 1/sqrt(D). group: an hsap.Group, None = one rank.
    strategy: "auto", "ring", "allgather", "ulysses", "usp", "sap", "hsap".
    return_lse: also return LSE [Hq, Tq] float32 (natural log; -inf for rows
      that see no key; no gradient flows through it).
    client: the session (default: group.client, else hsap.default_client()).
    Returns out [Tq, Hq, D] (q's dtype), or (out, lse).
    """
    if not isinstance(mask, masks.Mask):
        raise InvalidInputError(f"mask is a {type(mask).__name__}; build one with hsap.masks "
                                "(documents, varlen, shared_prefix, magi, from_slices)")
    check_tensors(q, k, v)
    out, lse = attend(q, k, v, mask, softmax_scale, group, strategy, client)
    return (out, lse) if return_lse else out


def longest(cu):
    return max((cu[i + 1] - cu[i] for i in range(len(cu) - 1)), default=0)


def check_max_seqlen(max_seqlen, cu, name, cu_name):
    if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < longest(cu):
        raise InvalidInputError(f"{name} is {max_seqlen!r} but the longest document in "
                                f"{cu_name} has {longest(cu)} tokens")


def varlen_attn(q, k, v, cu_seqlens, max_seqlen, softmax_scale=None, causal=True,
                window_size=(-1, -1), group=None, strategy="auto", return_lse=False,
                client=None):
    """The short form of hsap.flash_attn_varlen_func for self-attention over
    packed documents (cu_seqlens_q == cu_seqlens_k), causal by default.

    q: [T, Hq, D]; k, v: [T, Hkv, D] — this rank's tokens in dispatch order
      (all T tokens when group is None or has one rank).
    cu_seqlens: [docs + 1] int32/int64 tensor or list, global document
      boundaries. max_seqlen: the longest document (checked).
    causal: a bool, or one flag per document (True/'causal', False/'full').
    window_size: flash-attention's (left, right), -1 = unlimited; causal
      means right = 0.
    Other arguments as masked_attn. Returns out, or (out, lse).
    """
    check_tensors(q, k, v)
    cu = cu_seqlens_list(cu_seqlens)
    total, tokens = cu[-1], q.shape[0]
    size = 1 if group is None else group.size
    if size == 1 and tokens != total:
        raise InvalidInputError(f"cu_seqlens ends at {total} but q has {tokens} tokens "
                                "(a one-rank group holds every token: they must be equal)")
    if size > 1 and tokens > total:
        raise InvalidInputError(f"q has {tokens} tokens but cu_seqlens covers only {total}")
    if k.shape[0] != tokens:
        raise InvalidInputError(f"k has {k.shape[0]} tokens but q has {tokens}: self-attention "
                                "over documents takes as many keys as queries "
                                "(hsap.flash_attn_varlen_func takes cu_seqlens_k)")
    check_max_seqlen(max_seqlen, cu, "max_seqlen", "cu_seqlens")
    mask = masks.documents(cu, causal, window_size)
    out, lse = attend(q, k, v, mask, softmax_scale, group, strategy, client)
    return (out, lse) if return_lse else out

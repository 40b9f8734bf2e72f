"""hsap.varlen_attn: exact packed attention through hsapd, in place of
flash_attn_varlen_func, differentiable.

    out = hsap.varlen_attn(q, k, v, cu_seqlens, max_seqlen, causal=True)
    out, lse = hsap.varlen_attn(..., return_lse=True)
    out.backward(grad)            # Attention.Backward on the daemon

Tensors (DESIGN.md §4), T = this rank's tokens, in its dispatch order:
    q, out: [T, Hq, D]    k, v: [T, Hkv, D] (Hq % Hkv == 0)    lse: [Hq, T] float32
    dtype float32, bfloat16 or float16 (the same for q, k, v), CPU, contiguous.
cu_seqlens: [0, l1, l1 + l2, ..., total] over the *global* sequence (int32 or
int64 tensor, or a list of ints). With group=None (a one-rank group)
T == total; with a group of several ranks the caller passes its local tokens
as laid out by hsap.dispatch (see hsap.plans), and T is its share.

Validation happens here first — dtypes, contiguity, shapes, cu_seqlens
against the tensors, strategy, window — and raises hsap.InvalidInputError
(a ValueError; a dtype problem is InvalidDTypeError, also a TypeError) naming
the problem; what only the daemon can check (this rank's share of the
dispatch, limits) comes back as hsap.HsapError with the daemon's code and
message.

Data path: each call checks out an arena (a registered memfd region, reused
across calls), copies q/k/v in (one copy each, straight into the shared
pages) unless they already live in shared memory (Client.empty: referenced in
place), the daemon writes O and LSE there, and they are copied out into
ordinary tensors, which autograd saves for the backward call (the daemon
keeps no state between calls: Backward carries O and LSE).
"""

import math

import torch

from hsap.client import default_client
from hsap.errors import InvalidDTypeError, InvalidInputError
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


def cu_seqlens_list(cu_seqlens, name="cu_seqlens"):
    """cu_seqlens as a list of ints, checked: 1-D integers, starts at 0,
    non-decreasing."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise InvalidDTypeError(f"{name}.dtype is {cu_seqlens.dtype}; it must be torch.int32 "
                                    "or torch.int64")
        if cu_seqlens.dim() != 1:
            raise InvalidInputError(f"{name} has shape {list(cu_seqlens.shape)}; it must be 1-D")
        values = cu_seqlens.detach().cpu().tolist()
    else:
        try:
            values = [int(x) for x in cu_seqlens]
        except (TypeError, ValueError):
            raise InvalidInputError(f"{name} must be a 1-D integer tensor or a sequence of ints, "
                                    f"not {type(cu_seqlens).__name__}") from None
        if any(isinstance(x, float) for x in cu_seqlens):
            raise InvalidDTypeError(f"{name} holds floats; it must hold integers")
    if len(values) < 1:
        raise InvalidInputError(f"{name} is empty; it needs at least [0]")
    if values[0] != 0:
        raise InvalidInputError(f"{name}[0] is {values[0]}; it must be 0")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise InvalidInputError(f"{name} decreases at index {i} ({values[i - 1]} -> "
                                    f"{values[i]}); it must be non-decreasing")
    return values


def _check_tensors(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InvalidInputError(f"{name} is a {type(t).__name__}; it must be a torch.Tensor")
    if q.dtype not in DTYPES:
        raise InvalidDTypeError(f"q.dtype is {q.dtype}; it must be torch.float32, torch.bfloat16 "
                                "or torch.float16")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise InvalidDTypeError(f"{name}.dtype is {t.dtype} but q.dtype is {q.dtype}; q, k "
                                    "and v must have the same dtype")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cpu":
            raise InvalidInputError(f"{name} is on {t.device}; this client passes CPU tensors "
                                    "(memfd regions)")
        if t.dim() != 3:
            raise InvalidInputError(f"{name} has shape {list(t.shape)}; it must be 3-D "
                                    f"[tokens, heads, head_dim]")
        if not t.is_contiguous():
            raise InvalidInputError(f"{name} is not contiguous (shape {list(t.shape)}, strides "
                                    f"{list(t.stride())}); call .contiguous() first")
    tokens, hq, d = q.shape
    if k.shape[0] != tokens or k.shape[2] != d:
        raise InvalidInputError(f"k.shape is {list(k.shape)} but q.shape is {list(q.shape)}: k "
                                f"must be [{tokens}, Hkv, {d}]")
    if v.shape != k.shape:
        raise InvalidInputError(f"v.shape is {list(v.shape)} but k.shape is {list(k.shape)}")
    hkv = k.shape[1]
    if hkv < 1 or hq % hkv != 0:
        raise InvalidInputError(f"k has {hkv} heads but q has {hq}: Hq must be a multiple of Hkv")


def _window_left(causal, window_size):
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise InvalidInputError(f"window_size is {window_size!r}; it must be a pair "
                                "(left, right)") from None
    if left < -1 or right < -1:
        raise InvalidInputError(f"window_size is {tuple(window_size)}; entries must be >= -1 "
                                "(-1 = unlimited)")
    if causal:
        if right not in (-1, 0):
            raise InvalidInputError(f"window_size is {tuple(window_size)} with causal=True: "
                                    "the right window must be -1 or 0")
        return left
    if (left, right) != (-1, -1):
        raise InvalidInputError(f"window_size is {tuple(window_size)} with causal=False: hsapd "
                                "takes sliding windows for causal documents only")
    return -1


class _Call:
    """Everything of one varlen_attn call but the tensors: the collective,
    the mask and the options (the same for its forward and backward)."""

    def __init__(self, client, group, mask, options):
        self.client = client
        self.group = group
        self.mask = mask
        self.options = options

    def call_id(self, call_seq):
        return common_pb2.CallId(group=self.group.name, rank=self.group.rank,
                                 group_size=self.group.size, call_seq=call_seq)


def _layout(specs):
    """Byte offsets, 64-byte aligned, for (name, shape, dtype) specs."""
    offsets, at = {}, 0
    for name, shape, dtype in specs:
        offsets[name] = (at, shape, dtype)
        numel = 1
        for d in shape:
            numel *= d
        at += (numel * torch.empty((), dtype=dtype).element_size() + 63) // 64 * 64
    return offsets, max(at, 64)


def _ref(region, offset, shape, dtype):
    return common_pb2.TensorRef(region_id=region.region_id, offset=offset, shape=list(shape),
                                dtype=DTYPES.get(dtype, common_pb2.DTYPE_FLOAT32))


def _stage(call, inputs, outputs):
    """Places one call's tensors: each input (name, tensor) that lies in a
    region of the client's (Client.empty) is referenced in place, the others
    are copied into an arena checked out for the call; outputs (name, shape,
    dtype) get arena space. Returns (arena, refs by name, output views by
    name); REQUIRES: checkin_arena(arena) after the call."""
    client = call.client
    refs, specs, copies = {}, [], []
    for name, tensor in inputs:
        found = client.locate(tensor)
        if found is not None:
            region, offset = found
            refs[name] = _ref(region, offset, tensor.shape, tensor.dtype)
        else:
            specs.append((name, tensor.shape, tensor.dtype))
            copies.append((name, tensor))
    specs += outputs
    offsets, nbytes = _layout(specs)
    arena = client.checkout_arena(nbytes)
    region = arena.region
    views = {n: region.view(off, shape, dt) for n, (off, shape, dt) in offsets.items()}
    for name, tensor in copies:
        views[name].copy_(tensor)
        client.copied_bytes += tensor.numel() * tensor.element_size()
    for n, (off, shape, dt) in offsets.items():
        refs[n] = _ref(region, off, shape, dt)
    return arena, refs, views


def _run_forward(call, q, k, v):
    """O [T, Hq, D] and LSE [Hq, T] (float32) of one forward call."""
    t, hq, _ = q.shape
    arena, refs, views = _stage(call, [("q", q), ("k", k), ("v", v)],
                                [("o", q.shape, q.dtype), ("lse", (hq, t), torch.float32)])
    try:
        def submit(call_seq):
            return call.client.forward(attention_pb2.AttentionForwardRequest(
                call=call.call_id(call_seq), mask=call.mask, options=call.options,
                q=refs["q"], k=refs["k"], v=refs["v"], o=refs["o"], lse=refs["lse"]))

        call.group.run(submit)
        return views["o"].clone(), views["lse"].clone()
    finally:
        call.client.checkin_arena(arena)


def _run_backward(call, q, k, v, o, lse, d_o):
    """dQ, dK, dV of one backward call (shapes and dtype of q, k, v)."""
    arena, refs, views = _stage(
        call, [("q", q), ("k", k), ("v", v), ("o", o), ("lse", lse), ("d_o", d_o)],
        [("dq", q.shape, q.dtype), ("dk", k.shape, k.dtype), ("dv", v.shape, v.dtype)])
    try:
        def submit(call_seq):
            return call.client.backward(attention_pb2.AttentionBackwardRequest(
                call=call.call_id(call_seq), mask=call.mask, options=call.options,
                q=refs["q"], k=refs["k"], v=refs["v"], o=refs["o"], lse=refs["lse"],
                d_o=refs["d_o"], dq=refs["dq"], dk=refs["dk"], dv=refs["dv"]))

        call.group.run(submit)
        return views["dq"].clone(), views["dk"].clone(), views["dv"].clone()
    finally:
        call.client.checkin_arena(arena)


class VarlenAttnFunction(torch.autograd.Function):
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
        d_o = d_o.to(q.dtype).contiguous()
        dq, dk, dv = _run_backward(ctx.call, q, k, v, o, lse, d_o)
        return dq, dk, dv, None


def varlen_attn(q, k, v, cu_seqlens, max_seqlen, softmax_scale=None, causal=True,
                window_size=(-1, -1), group=None, strategy="auto", return_lse=False,
                client=None):
    """Exact attention over packed documents, computed by hsapd.

    q: [T, Hq, D]; k, v: [T, Hkv, D] — float32, bfloat16 or float16, CPU,
      contiguous; this rank's tokens in dispatch order (all T tokens when
      group is None or has one rank).
    cu_seqlens: [docs + 1] int32/int64 tensor or list, global document
      boundaries, cu_seqlens[-1] = total tokens of the group.
    max_seqlen: the longest document (checked; flash-attention's argument).
    softmax_scale: None = 1/sqrt(D).
    causal, window_size: flash-attention's (left, right) window; -1 =
      unlimited; a window needs causal=True (right must be 0 or -1).
    group: an hsap.Group (name, rank, size); None = a one-rank group of the
      client's session.
    strategy: "auto", "ring", "allgather", "ulysses", "usp", "sap", "hsap".
    return_lse: also return LSE [Hq, T] float32 (natural log; -inf for rows
      that see no key; no gradient flows through it).
    client: the session (default: group.client, else hsap.default_client()).
    Returns out [T, Hq, D] (q's dtype), or (out, lse).
    Raises InvalidInputError / InvalidDTypeError for bad arguments, HsapError
    for the daemon's errors.
    """
    _check_tensors(q, k, v)
    cu = cu_seqlens_list(cu_seqlens)
    total = cu[-1]
    tokens = q.shape[0]
    size = 1 if group is None else group.size
    if size == 1 and tokens != total:
        raise InvalidInputError(f"cu_seqlens ends at {total} but q has {tokens} tokens "
                                "(a one-rank group holds every token: they must be equal)")
    if size > 1 and tokens > total:
        raise InvalidInputError(f"q has {tokens} tokens but cu_seqlens covers only {total}")
    longest = max((cu[i + 1] - cu[i] for i in range(len(cu) - 1)), default=0)
    if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < longest:
        raise InvalidInputError(f"max_seqlen is {max_seqlen!r} but the longest document in "
                                f"cu_seqlens has {longest} tokens")
    if softmax_scale is None:
        scale = 0.0
    else:
        scale = float(softmax_scale)
        if not math.isfinite(scale) or scale <= 0:
            raise InvalidInputError(f"softmax_scale is {softmax_scale!r}; it must be finite "
                                    "and > 0 (None = 1/sqrt(head_dim))")
    window = _window_left(bool(causal), window_size)
    strategy_value = strategy_enum(strategy)
    if client is None:
        client = group.client if group is not None and group.client is not None else default_client()
    if group is None:
        group = client.solo_group()
    mask = attention_pb2.MaskSpec(
        cu_seqlens=attention_pb2.CuSeqlens(inline_values=attention_pb2.Int64List(values=cu)),
        causal=bool(causal))
    if window >= 0:
        mask.window_left = window
    options = attention_pb2.CallOptions(softmax_scale=scale, strategy=strategy_value,
                                        assignment=assignment_enum(group.assignment),
                                        deadline_ms=group.deadline_ms)
    call = _Call(client, group, mask, options)
    out, lse = VarlenAttnFunction.apply(q, k, v, call)
    return (out, lse) if return_lse else out

"""hsap.shard and hsap.unshard: a packed batch's rows on the rank that holds
them, and back, in one call each.

    (ids, labels), sharding = hsap.shard([ids, labels], cu_seqlens, group,
                                         heads=H, kv_heads=Hkv, head_dim=D)
    positions = sharding.position_ids          # per-document positions (rotary)
    ...                                        # the model on this rank's rows
    out = attn(q, k, v, sharding)              # hsap.nn.ContextParallelAttention
    logits = hsap.unshard(local_logits, sharding)   # [T, ...] in global order

shard asks the daemon for the layout (Plans.Dispatch, through hsap.dispatch
with group=: world size, nodes, assignment, client and this rank all come
from the group) and keeps this rank's rows of every tensor: any tensor
whose leading dimension is the T = cu_seqlens[-1] tokens of the pack (1-D
ids, positions, labels; 2-D or 3-D hidden states), given alone, as a
list/tuple or as a dict (None entries pass through). Every rank passes the
whole pack (a data loader's global batch) and gets its own rows; the rows of
a rank are its dispatch ranges concatenated (DESIGN.md §4), which is the
order hsapd reads them in.

The layout depends on everything that shapes the plan: the documents
(cu_seqlens, causal, window_size), the group (size, nodes, assignment), the
head shape (heads, kv_heads, head_dim, dtype) and the strategy. A Sharding
records them with the layout's hash; ContextParallelAttention checks each
call against it (Sharding.check_call):

* caught before the call (InvalidInputError naming what differs): tensors
  with another row count than this rank's share; a module of another group;
  a call whose mask, head shape, dtype or strategy lays the tokens out
  differently from the sharding (a call that differs only in fields that
  do not move tokens is accepted: the client asks the daemon for that
  call's layout once per sharding and compares hashes);
* caught after the forward call (HsapError FAILED_PRECONDITION; the output
  is not returned): the daemon ran a plan whose layout differs from the
  sharding's. CallStats.plan_key names the plan that ran; when it is not
  the sharding's (a multi-node call plans with the group's measured links,
  so its key differs from hsap.dispatch's even for the same layout), its
  layout is asked once per sharding (Plans.ShowPlan) and compared. This
  catches a call whose topology differs from what hsap.dispatch was told
  (e.g. a group without a node list spanning a static cluster) once
  layouts depend on it;
* not caught: rows that were reordered or taken from another batch of the
  same length by hand (tensors carry no record of where their rows came
  from) — and hsap.varlen_attn / flash_attn_varlen_func, which take no
  Sharding, are not checked beyond the daemon's row count check.

unshard gathers every rank's rows over the group's torch.distributed
process group (Group.process_group, set by Group.from_process_group and
hsap.init_from_env): one all_gather of rows padded to the largest share
(gloo and NCCL need equal sizes), then each rank's rows are put back at
their global positions. It is differentiable: the backward all-reduces the
global gradient (sum over ranks, torch.distributed.nn.all_gather's
convention: the objective is the sum of what every rank computes from the
gathered tensor) and keeps this rank's rows, so every rank must run that
backward. A one-rank group needs no process group. Rows travel as bytes
(bit for bit, any dtype: gloo lacks bfloat16 and bool).

Layer: above the calls (hsap.plans, hsap.masks), below hsap.distributed.
"""

import grpc
import torch

from hsap import masks
from hsap.client import HsapError, InvalidInputError
from hsap.groups import Group
from hsap.plans import dispatch, plan_layout

class Sharding:
    """The layout of one packed batch over a group's ranks (from hsap.shard).

    group: the hsap.Group. rank: group.rank (not the pg rank). cu_seqlens:
      the documents (list of ints); max_seqlen: the longest. causal,
      window_size, heads, kv_heads, head_dim, dtype, strategy: what the
      layout was planned for.
    dispatch: the hsap.Dispatch (every rank's ranges); layout_hash,
      plan_key: its digest and the daemon's plan key.
    indices: int64 [local_tokens], the global token of each local row.
    position_ids: int64 [local_tokens], each local row's position inside
      its document (0 at the document's first token; what rotary
      embeddings need). document_ids: int64 [local_tokens], its document.
    local_tokens, total_tokens: this rank's and the global token counts.
    Immutable after construction, apart from its cache of verified calls.
    """

    def __init__(self, group, cu_seqlens, layout, causal, window_size, heads, kv_heads,
                 head_dim, dtype, strategy):
        self.group = group
        self.rank = group.rank
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max((b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])), default=0)
        self.causal = causal
        self.window_size = window_size
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.dtype = dtype
        self.strategy = strategy
        self.dispatch = layout
        self.layout_hash = layout.layout_hash
        self.plan_key = layout.plan_key
        self.total_tokens = cu_seqlens[-1]
        self.indices = layout.indices(group.rank)
        self.local_tokens = int(self.indices.numel())
        cu = torch.tensor(cu_seqlens, dtype=torch.int64)
        self.document_ids = torch.searchsorted(cu[1:], self.indices, right=True)
        self.position_ids = self.indices - cu[self.document_ids]
        # (causal, window, heads, kv_heads, head_dim, dtype, strategy) -> plan key
        # of a call verified to lay tokens out as this sharding does.
        self._verified = {self._spec(causal, window_size, heads, kv_heads, head_dim, dtype,
                                     strategy): self.plan_key}
        self._masks = {}
        self._ran_ok = set()  # plan keys that ran and have this layout

    @staticmethod
    def _spec(causal, window_size, heads, kv_heads, head_dim, dtype, strategy):
        causal = tuple(causal) if isinstance(causal, (list, tuple)) else causal
        return (causal, tuple(window_size), heads, kv_heads, head_dim, dtype,
                strategy.lower() if isinstance(strategy, str) else strategy)

    def mask(self, causal=None, window_size=None):
        """The hsap.masks.Mask of the documents (the sharding's causal and
        window unless given)."""
        causal = self.causal if causal is None else causal
        window_size = self.window_size if window_size is None else tuple(window_size)
        key = (tuple(causal) if isinstance(causal, (list, tuple)) else causal, window_size)
        if key not in self._masks:
            self._masks[key] = masks.documents(self.cu_seqlens, causal, window_size)
        return self._masks[key]

    def shard(self, tensors):
        """This rank's rows of more tensors of the same pack (see hsap.shard)."""
        return _map(tensors, "tensors", lambda t, name: _local_rows(t, name, self))

    def check_call(self, group, q, k, v, causal, window_size, strategy):
        """Returns the plan key the daemon must run for this call, or raises
        InvalidInputError when q, k, v [local_tokens, H, D] of `group` under
        (causal, window_size, strategy) are not laid out as this sharding
        is (see the module comment for what is caught)."""
        if group is not self.group:
            raise InvalidInputError(
                f"the sharding was made for {self.group!r} but the call is of {group!r}: shard "
                "with the module's group")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() < 1 or t.shape[0] != self.local_tokens:
                raise InvalidInputError(
                    f"{name} has {t.shape[0] if t.dim() else 0} rows but rank {self.rank}'s "
                    f"share of the sharding (layout {self.layout_hash[:12]}) has "
                    f"{self.local_tokens}: pass the rows of this sharding")
        if q.dim() != 3 or k.dim() != 3:
            return None  # the call's own validation names the shape problem
        spec = self._spec(causal, window_size, q.shape[1], k.shape[1], q.shape[2], q.dtype,
                          strategy)
        if spec in self._verified:
            return self._verified[spec]
        other = dispatch(self.cu_seqlens, heads=spec[2], kv_heads=spec[3], head_dim=spec[4],
                         dtype=spec[5], strategy=strategy, causal=causal,
                         window_size=window_size, group=self.group)
        if other.layout_hash != self.layout_hash:
            mine = self._spec(self.causal, self.window_size, self.heads, self.kv_heads,
                              self.head_dim, self.dtype, self.strategy)
            names = ("causal", "window_size", "heads", "kv_heads", "head_dim", "dtype",
                     "strategy")
            diff = ", ".join(f"{n} {a!r} (sharded with {b!r})"
                             for n, a, b in zip(names, spec, mine) if a != b)
            raise InvalidInputError(
                f"this call lays the tokens out as layout {other.layout_hash[:12]} ({diff}) but "
                f"q, k, v were sharded with layout {self.layout_hash[:12]}: computing it would "
                "attend the wrong tokens; shard with the call's arguments")
        self._verified[spec] = other.plan_key
        return other.plan_key

    def check_plan(self, plan_key, stats):
        """After a forward call: raises HsapError(FAILED_PRECONDITION) when
        the daemon's CallStats name another plan than `plan_key` whose
        layout differs from this sharding's (asked once per plan with
        Plans.ShowPlan; the call's output must then be dropped)."""
        ran = getattr(stats, "plan_key", "") if stats is not None else ""
        if not ran or not plan_key or ran == plan_key or ran in self._ran_ok:
            return
        try:
            layout = plan_layout(ran, self.group.client).layout_hash
        except HsapError as e:
            layout = f"unknown ({e.code.name}: {e.message})"
        if layout != self.layout_hash:
            raise HsapError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the daemon ran plan {ran} (layout {layout[:12]}) but q, k, v were sharded "
                f"with layout {self.layout_hash[:12]} (plan {plan_key}): the call's topology or "
                f"spec differs from what hsap.dispatch was told ({self.group!r}); its output "
                "was dropped")
        self._ran_ok.add(ran)

    def __repr__(self):
        return (f"Sharding(rank={self.rank}/{self.group.size}, tokens={self.local_tokens}/"
                f"{self.total_tokens}, documents={len(self.cu_seqlens) - 1}, "
                f"layout={self.layout_hash[:12]})")


def _map(tensors, what, fn):
    """fn over a tensor, a list/tuple or a dict of tensors (None kept)."""
    if isinstance(tensors, torch.Tensor):
        return fn(tensors, what)
    if isinstance(tensors, dict):
        return {k: None if t is None else fn(t, f"{what}[{k!r}]") for k, t in tensors.items()}
    if isinstance(tensors, (list, tuple)):
        out = [None if t is None else fn(t, f"{what}[{i}]") for i, t in enumerate(tensors)]
        return type(tensors)(out) if isinstance(tensors, tuple) else out
    raise InvalidInputError(f"{what} is a {type(tensors).__name__}; give a tensor, or a list, "
                            "tuple or dict of tensors")


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise InvalidInputError(f"{name} is a {type(t).__name__}; it must be a torch.Tensor")
    if t.dim() < 1:
        raise InvalidInputError(f"{name} is a 0-D tensor; its leading dimension must be tokens")


def _local_rows(t, name, sharding):
    _check_tensor(t, name)
    if t.shape[0] != sharding.total_tokens:
        raise InvalidInputError(f"{name} has {t.shape[0]} rows but cu_seqlens ends at "
                                f"{sharding.total_tokens}: the leading dimension must be the "
                                "pack's tokens")
    return t.index_select(0, sharding.indices.to(t.device))


def shard(tensors, cu_seqlens, group, *, heads, head_dim, kv_heads=None, dtype=torch.float32,
          causal=True, window_size=(-1, -1), strategy="auto"):
    """This rank's rows of every tensor of a packed batch, and the Sharding.

    tensors: a tensor or a list/tuple/dict of tensors, each [T, ...] with T
      = cu_seqlens[-1] (the whole pack, on every rank).
    cu_seqlens: [docs + 1] int32/int64 tensor or list, the documents.
    group: the hsap.Group of the attention calls.
    heads, kv_heads (default heads), head_dim, dtype, causal, window_size,
      strategy: those of the attention calls that will use the layout (a
      call with others is checked against the daemon's layout for them).
    Returns (local, sharding): local has the structure of `tensors`, each
      tensor [sharding.local_tokens, ...] in this rank's row order.
    Raises InvalidInputError naming the tensor for a wrong leading
    dimension; the daemon's errors as HsapError.
    """
    if not isinstance(group, Group):
        raise InvalidInputError(f"group is a {type(group).__name__}; it must be an hsap.Group "
                                "(hsap.init_from_env, Group.from_process_group, hsap.Group)")
    cu = masks.cu_seqlens_values(cu_seqlens)
    window_size = tuple(window_size)
    kv_heads = heads if kv_heads is None else kv_heads
    _map(tensors, "tensors", _check_tensor)  # before asking the daemon
    layout = dispatch(cu, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                      strategy=strategy, causal=causal, window_size=window_size, group=group)
    sharding = Sharding(group, cu, layout, causal, window_size, heads, kv_heads, head_dim, dtype,
                        strategy)
    return sharding.shard(tensors), sharding


# --- unshard --------------------------------------------------------------------


def _all_gather_rows(x, sharding):
    """[total_tokens, ...] from every rank's x [its tokens, ...] (no autograd)."""
    group, layout = sharding.group, sharding.dispatch
    out = x.new_empty((sharding.total_tokens,) + tuple(x.shape[1:]))
    if group.size == 1:
        out[sharding.indices.to(x.device)] = x
        return out
    pg = group.process_group
    if pg is None:
        raise InvalidInputError(
            f"unshard gathers over the group's torch.distributed process group, but {group!r} "
            "has none: form it with hsap.Group.from_process_group or hsap.init_from_env")
    import torch.distributed as dist
    counts = [layout.tokens(r) for r in range(group.size)]
    row_shape = tuple(x.shape[1:])
    padded = x.new_zeros((max(counts),) + row_shape)
    padded[:x.shape[0]] = x
    wire = padded.reshape(-1).view(torch.uint8)  # bytes: any dtype, bit for bit
    parts = [torch.empty_like(wire) for _ in range(group.size)]
    dist.all_gather(parts, wire, group=pg)
    for r in range(group.size):
        part = parts[group.pg_ranks[r]].view(x.dtype).view((max(counts),) + row_shape)
        out[layout.indices(r).to(x.device)] = part[:counts[r]]
    return out


class _Unshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, sharding):
        ctx.sharding = sharding
        return _all_gather_rows(x, sharding)

    @staticmethod
    def backward(ctx, grad):
        sharding = ctx.sharding
        grad = grad.contiguous()
        if sharding.group.size > 1:
            import torch.distributed as dist
            grad = grad.clone()
            dist.all_reduce(grad, group=sharding.group.process_group)
        return grad.index_select(0, sharding.indices.to(grad.device)), None


def unshard(local, sharding):
    """Every rank's rows put back in global order: for each tensor
    [sharding.local_tokens, ...] of `local` (a tensor, or a list/tuple/dict
    of them), the [sharding.total_tokens, ...] tensor of the whole pack, on
    every rank. A collective over the group's process group (every rank
    calls it with the same structure); differentiable (see the module
    comment)."""
    if not isinstance(sharding, Sharding):
        raise InvalidInputError(f"sharding is a {type(sharding).__name__}; pass the Sharding "
                                "hsap.shard returned")

    def one(t, name):
        _check_tensor(t, name)
        if t.shape[0] != sharding.local_tokens:
            raise InvalidInputError(f"{name} has {t.shape[0]} rows but rank {sharding.rank} "
                                    f"holds {sharding.local_tokens} of the sharding")
        if t.requires_grad and torch.is_grad_enabled():
            return _Unshard.apply(t, sharding)
        return _all_gather_rows(t.detach(), sharding)

    return _map(local, "local", one)

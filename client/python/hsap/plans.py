"""hsap.dispatch: which global tokens each rank of a group holds (Plans.Dispatch).

    layout = hsap.dispatch(cu_seqlens, heads=4, kv_heads=4, head_dim=32, group=group)
    layout.indices()      # torch.int64 [T_r]: this rank's (group.rank's) rows, in order
    q_local = q_global[layout.indices()]

    layout = hsap.dispatch(cu_seqlens, world_size=4, heads=4, kv_heads=4,
                           head_dim=32, dtype=torch.float32)   # without a group
    layout.ranges[r]      # [(begin, end), ...] global token ranges of rank r
    layout.indices(r)     # torch.int64 [T_r]: rank r's rows, in order

With group= the world size, nodes, assignment, client and this rank come
from the group, so they cannot disagree with the calls (hsap.shard is the
one-call form: it also gathers the rows).

The layout depends on the mask (cu_seqlens, causal, window, or an
hsap.masks.Mask), the group's topology, head shape, dtype, strategy and
assignment: pass the same ones to the attention calls (the assignment
through hsap.Group(assignment=...)).

    layout = hsap.dispatch(hsap.masks.shared_prefix([(64, [30, 40])]), 4, 4, 4, 32)

The daemon compiles (and caches) the plan to answer, so the call that
follows hits the cache.
"""

import hashlib

import torch

from hsap import masks
from hsap.attention import DTYPES, assignment_enum, strategy_enum
from hsap.client import default_client
from hsap.errors import InvalidDTypeError, InvalidInputError
from hsap.v1 import common_pb2
from hsap.v1 import plan_pb2
from hsap.v1 import plans_pb2

_DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_STRATEGY_NAMES = {v: k for k, v in
                   (("ring", common_pb2.STRATEGY_RING), ("allgather", common_pb2.STRATEGY_ALLGATHER),
                    ("ulysses", common_pb2.STRATEGY_ULYSSES), ("usp", common_pb2.STRATEGY_USP),
                    ("sap", common_pb2.STRATEGY_SAP), ("hsap", common_pb2.STRATEGY_HSAP),
                    ("auto", common_pb2.STRATEGY_AUTO))}


class Dispatch:
    """The token layout of a group.

    ranges: per rank, its sorted global [begin, end) ranges; its local rows
      are these concatenated. strategy: what "auto" resolved to.
    plan_key: the key of the compiled plan. total_tokens: the global count.
    rank: the group's rank when made with group=, else None (indices() and
      tokens() then default to it).
    layout_hash: a digest of the ranges of every rank (equal layouts, equal
      hashes).
    """

    def __init__(self, ranges, strategy, plan_key, total_tokens, rank=None):
        self.ranges = ranges
        self.strategy = strategy
        self.plan_key = plan_key
        self.total_tokens = total_tokens
        self.rank = rank
        digest = hashlib.sha256(f"{total_tokens}".encode())
        for rank_ranges in ranges:
            digest.update(b"|" + ",".join(f"{b}-{e}" for b, e in rank_ranges).encode())
        self.layout_hash = digest.hexdigest()[:32]

    def _rank(self, rank):
        if rank is None:
            if self.rank is None:
                raise InvalidInputError("give the rank: this Dispatch was made without group=")
            return self.rank
        return rank

    def __len__(self):
        return len(self.ranges)

    def __getitem__(self, rank):
        return self.ranges[rank]

    def tokens(self, rank=None):
        """Rank `rank`'s token count (default: the group's rank)."""
        return sum(e - b for b, e in self.ranges[self._rank(rank)])

    def indices(self, rank=None):
        """torch.int64 [tokens(rank)]: the global token of each local row
        (default: the group's rank)."""
        parts = [torch.arange(b, e, dtype=torch.int64) for b, e in self.ranges[self._rank(rank)]]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def __repr__(self):
        return (f"Dispatch(ranks={len(self.ranges)}, total_tokens={self.total_tokens}, "
                f"strategy={self.strategy!r}, plan_key={self.plan_key!r})")


def _from_proto(proto, strategy, plan_key, rank):
    ranges = [[(r.begin, r.end) for r in ranks.ranges] for ranks in proto.ranks]
    return Dispatch(ranges, _STRATEGY_NAMES.get(strategy, str(strategy)), plan_key,
                    proto.total_tokens, rank)


def plan_layout(plan_key, client=None, rank=None):
    """The Dispatch of the plan `plan_key` cached on the daemon behind
    `client` (Plans.ShowPlan; HsapError NOT_FOUND when it is not cached)."""
    client = client or default_client()
    resp = client.show_plan(plans_pb2.ShowPlanRequest(plan_key=plan_key))
    return _from_proto(resp.plan.dispatch, resp.plan.strategy, plan_key, rank)


def dispatch(cu_seqlens, world_size=None, heads=None, kv_heads=None, head_dim=None,
             dtype=torch.float32, strategy="auto", assignment=None, nodes=None, causal=True,
             window_left=-1, profile="", client=None, *, window_size=None, group=None):
    """Asks the daemon how a group of `world_size` ranks (over `nodes` nodes)
    must lay out the tokens of this mask; returns a Dispatch.

    group: an hsap.Group; then world_size, nodes, assignment and client
      default to the group's (group.size, group.num_nodes, group.assignment,
      group.client; a different value given is refused) and the Dispatch's
      rank is group.rank. Without a group: world_size is required,
      assignment defaults to "balanced", nodes to 1.
    cu_seqlens: global document boundaries (tensor or list of ints) with
      `causal` (a bool, or one flag per document) and either `window_left`
      (a causal sliding window) or flash-attention's `window_size = (left,
      right)`; or an hsap.masks.Mask (num_q == num_k) — then causal and the
      windows are not used.
    heads, kv_heads, head_dim, dtype: the shape of q/k/v (dtype: torch dtype
      or "fp32"/"bf16"/"fp16"); kv_heads defaults to heads.
    strategy, assignment: as for the attention calls / hsap.Group.
    profile: the cost model's hardware; "" (the default): the daemon's
      (hsapd --profile, "measured" unless set), which its attention calls
      plan with. The layout does not depend on it (the assignment policy
      places tokens from the mask alone); the strategy `auto` resolves to
      does.
    The call that follows must use the same mask: flash_attn_varlen_func(...,
    causal, window_size) builds hsap.masks.varlen(cu_q, cu_k, causal,
    window_size), which is what this builds from cu_seqlens, causal and
    window_size.
    Raises InvalidInputError for bad arguments, HsapError for the daemon's
    (INVALID_ARGUMENT names the spec field; FAILED_PRECONDITION when the
    strategy cannot run on this topology or head count).
    """
    if group is not None:
        for name, given, own in (("world_size", world_size, group.size),
                                 ("nodes", nodes, group.num_nodes),
                                 ("assignment", assignment, group.assignment)):
            if given is not None and given != own:
                raise InvalidInputError(f"{name} is {given!r} but the group's is {own!r} "
                                        f"({group!r}); leave it out with group=")
        world_size, nodes, assignment = group.size, group.num_nodes, group.assignment
        client = client or group.client
    elif world_size is None:
        raise InvalidInputError("give world_size (or group=)")
    assignment = "balanced" if assignment is None else assignment
    nodes = 1 if nodes is None else nodes
    if isinstance(cu_seqlens, masks.Mask):
        mask = cu_seqlens
        if not mask.is_square:
            raise InvalidInputError(
                f"the mask has {mask.num_q} query rows but {mask.num_k} key rows: a group of "
                "several ranks holds one token space (as many query as key rows)")
    else:
        if window_size is None:
            # window_left: flash-attention's window_size = (window_left, 0).
            if int(window_left) >= 0 and causal is False:
                raise InvalidInputError(f"window_left is {window_left} with causal=False: "
                                        "use window_size=(left, right) for two-sided windows")
            window_size = (int(window_left), 0) if int(window_left) >= 0 else (-1, -1)
        mask = masks.documents(cu_seqlens, causal, window_size)
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPE_NAMES:
            raise InvalidDTypeError(f"dtype {dtype!r} is unknown; use fp32, bf16 or fp16")
        dtype = _DTYPE_NAMES[dtype.lower()]
    if dtype not in DTYPES:
        raise InvalidDTypeError(f"dtype is {dtype}; it must be torch.float32, torch.bfloat16 or "
                                "torch.float16")
    kv_heads = heads if kv_heads is None else kv_heads
    for name, value in (("world_size", world_size), ("nodes", nodes), ("heads", heads),
                        ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} is {value!r}; it must be an int >= 1")
    if world_size % nodes != 0:
        raise InvalidInputError(f"world_size {world_size} is not a multiple of nodes {nodes}")
    spec = plan_pb2.PlanSpec(
        topology=plan_pb2.Topology(num_nodes=nodes, devices_per_node=world_size // nodes),
        shape=plan_pb2.HeadShape(num_heads_q=heads, num_heads_kv=kv_heads, head_dim=head_dim,
                                 dtype=DTYPES[dtype]),
        strategy=strategy_enum(strategy), assignment=assignment_enum(assignment),
        profile=profile, **mask.plan_spec_fields())
    client = client or default_client()
    resp = client.plans_dispatch(plans_pb2.DispatchRequest(spec=spec))
    return _from_proto(resp.dispatch, resp.strategy, resp.plan_key,
                       None if group is None else group.rank)

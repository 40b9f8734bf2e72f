"""hsap.nn.ContextParallelAttention: the attention of any block, computed by
hsapd over a context-parallel group, as a torch.nn.Module.

    attn = hsap.nn.ContextParallelAttention(group, causal=True)
    (ids,), sharding = hsap.shard([ids], cu_seqlens, group, heads=H, kv_heads=Hkv, head_dim=D)
    ...
    out = attn(q, k, v, sharding)     # q [local, H, D], k, v [local, Hkv, D] -> [local, H, D]

Projections-free, like flash-attention's functions: q, k, v are this rank's
rows (in the sharding's order), the output is this rank's rows. causal,
window_size and softmax_scale mean what they mean in flash_attn_varlen_func
(documents attend only to themselves; window (left, right), -1 unlimited;
scale None = 1/sqrt(head_dim)). Every forward and every backward is one
collective call of the group (hsap.groups: each takes the group's next
call number), so

* torch.utils.checkpoint works: the recomputation in backward is one more
  forward call, made by every rank at the same point of its backward;
* gradient accumulation works: each micro-batch's forward and backward are
  calls of their own; the gradients of q, k, v add up in autograd as usual;
* the module holds no parameters and no state between calls (the daemon
  keeps none either: backward carries O and LSE).

Every rank must run the same modules in the same order (as with any
collective). Each call is checked against the sharding before it is sent
and against the plan the daemon ran after the forward call
(hsap.sharding: what is and is not caught).

Layer: above hsap.sharding and hsap.attention.
"""

import torch

from hsap.attention import attend, check_tensors, scale_value, strategy_enum
from hsap.client import InvalidInputError
from hsap.groups import Group
from hsap.sharding import Sharding


class ContextParallelAttention(torch.nn.Module):
    """Exact attention over a packed batch split across a group's ranks.

    group: the hsap.Group of the calls (hsap.init_from_env,
      Group.from_process_group, hsap.Group).
    causal: True (default) or False, or one flag per document.
    window_size: (left, right), -1 = unlimited (flash-attention's).
    softmax_scale: None = 1/sqrt(head_dim).
    strategy: "auto" (default) or a named strategy (hsap.attention).
    forward(q, k, v, sharding) -> out [local_tokens, Hq, D] (q's dtype).
    """

    def __init__(self, group, causal=True, window_size=(-1, -1), softmax_scale=None,
                 strategy="auto"):
        super().__init__()
        if not isinstance(group, Group):
            raise InvalidInputError(f"group is a {type(group).__name__}; it must be an hsap.Group")
        self.group = group
        self.causal = list(causal) if isinstance(causal, (list, tuple)) else bool(causal)
        self.window_size = tuple(int(w) for w in window_size)
        scale_value(softmax_scale)  # validated here, used per call
        self.softmax_scale = softmax_scale
        strategy_enum(strategy)
        self.strategy = strategy

    def forward(self, q, k, v, sharding):
        """q: [local_tokens, Hq, D]; k, v: [local_tokens, Hkv, D], the rows
        of `sharding` (an hsap.Sharding of this module's group). Returns
        the output rows [local_tokens, Hq, D]."""
        if not isinstance(sharding, Sharding):
            raise InvalidInputError(f"sharding is a {type(sharding).__name__}; pass the Sharding "
                                    "hsap.shard returned for this batch")
        check_tensors(q, k, v)
        plan_key = sharding.check_call(self.group, q, k, v, self.causal, self.window_size,
                                       self.strategy)
        mask = sharding.mask(self.causal, self.window_size)
        out, _ = attend(q, k, v, mask, self.softmax_scale, self.group, self.strategy,
                        self.group.client)
        sharding.check_plan(plan_key, self.group.last_stats)
        return out

    def extra_repr(self):
        return (f"group={self.group.name!r}, size={self.group.size}, causal={self.causal}, "
                f"window_size={self.window_size}, softmax_scale={self.softmax_scale}, "
                f"strategy={self.strategy!r}")

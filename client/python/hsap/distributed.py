"""hsap.init_from_env: the group of every process torchrun started.

    # Under torchrun (each node's processes talk to their node's hsapd):
    group = hsap.init_from_env()              # init_process_group("gloo") + the group
    out = hsap.varlen_attn(q_local, k_local, v_local, cu, max_seqlen, group=group)

    # With a process group of your own (e.g. one context-parallel group):
    group = hsap.Group.from_process_group(cp_pg, client=hsap.connect())

How a group is formed from a process group (nodes, ranks, names, the
daemon's address) is described in hsap.groups, which implements it; this
module reads torchrun's environment, initialises torch.distributed and
opens the session. It is the top layer of the package. The formation
helpers are re-exported here under their old names (plan_group,
from_process_group, daemon_address, check_address, ADDRESS_ENV).
"""

import os

from hsap.client import HsapError, InvalidInputError, connect
from hsap.groups import (  # noqa: F401 - re-exported
    ADDRESS_ENV, _env_int, _gather, check_address, daemon_address, from_process_group,
    plan_group)

__all__ = ["ADDRESS_ENV", "check_address", "daemon_address", "from_process_group",
           "init_from_env", "plan_group"]


def init_from_env(name=None, socket_path=None, backend="gloo", **group_options):
    """The group of every process torchrun started: reads RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (each checked:
    InvalidInputError naming the variable and its value),
    torch.distributed.init_process_group(backend) unless already
    initialized, connects to the local daemon (socket_path, else
    $HSAP_SOCKET, else /run/hsap/hsapd.sock) and returns
    from_process_group(WORLD, name, client, **group_options) (assignment,
    deadline_ms, address, local_slot). The group's client is its own:
    close it with group.client.close()."""
    import torch.distributed as dist
    env = os.environ
    world = _env_int("WORLD_SIZE", env, 1)
    rank = _env_int("RANK", env, 0, world)
    local_world = _env_int("LOCAL_WORLD_SIZE", env, 1, world + 1)
    _env_int("LOCAL_RANK", env, 0, local_world)
    if not env.get("MASTER_ADDR"):
        raise InvalidInputError(f"$MASTER_ADDR is {env.get('MASTER_ADDR')!r}; run under torchrun "
                                "(it sets the rendezvous address)")
    _env_int("MASTER_PORT", env, 1, 65536)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    elif dist.get_rank() != rank or dist.get_world_size() != world:
        raise InvalidInputError(f"torch.distributed is initialized as rank {dist.get_rank()} of "
                                f"{dist.get_world_size()} but $RANK is {rank} and $WORLD_SIZE "
                                f"is {world}")
    try:
        client = connect(socket_path)
    except HsapError as e:  # the others are told too (they would wait in the gather)
        _gather(dist.group.WORLD, ("error", e.code.name, e.located_message))
    try:
        return from_process_group(dist.group.WORLD, name, client, **group_options)
    except BaseException:
        client.close()
        raise

"""Groups from torch.distributed: hsap.Group.from_process_group and
hsap.init_from_env.

    # Under torchrun (each node's processes talk to their node's hsapd):
    group = hsap.init_from_env()              # init_process_group("gloo") + the group
    out = hsap.varlen_attn(q_local, k_local, v_local, cu, max_seqlen, group=group)

    # With a process group of your own (e.g. one context-parallel group):
    group = hsap.Group.from_process_group(cp_pg, client=hsap.connect())

Formation is one all_gather_object over the process group: each rank
contributes its daemon's TCP address, its device slot and the name it asks
for. Every rank then derives the same group from the same gathered list:

* Nodes: the distinct daemon addresses, ordered by the first pg rank that
  names each one. Each node must hold the same number of ranks
  (InvalidInputError listing the counts otherwise, raised on every rank).
* Local rank: the ranks of one node ordered by their device slot (LOCAL_RANK
  under torchrun); without slots, by pg rank. hsapd runs local rank i on its
  device slot i (mod its slots).
* hsap rank = node_index * ranks_per_node + local rank (node-major, what the
  daemon requires). It equals the pg rank when the pg's ranks are already
  node-major with slots in pg rank order (torchrun's layout); otherwise it
  differs: use `group.rank` (not the pg rank) for hsap.dispatch's
  layout.indices, and `group.pg_ranks[r]` to find hsap rank r in the pg.
* Name: with name=None the group takes the name drawn by pg rank 0
  ("pg-<uuid4 hex>", so every formation is a new group, as a new NCCL
  communicator is); a given name must be the same on every rank.

The daemon's address: `address`, else $HSAP_ADDRESS ("host:port", exactly as
the daemon advertises it: --advertise_address, by default --host:--port),
else asked from the local daemon (GetClusterStatusResponse.self_address, or
this node's entry in its static cluster from an older daemon).
"""

import os
import uuid

import grpc

from hsap.client import connect, default_client
from hsap.errors import HsapError, InvalidInputError
from hsap.groups import Group

ADDRESS_ENV = "HSAP_ADDRESS"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")


def check_address(address, what):
    """`address` if it is "host:port" with a port in [1, 65535], else
    InvalidInputError naming `what` (where it came from) and the value."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if sep and host and port.isdigit() and 1 <= int(port) <= 65535:
            return address
    raise InvalidInputError(f"{what} is {address!r}; it must be the daemon's TCP address "
                            "'host:port' as it advertises it (--advertise_address)")


def daemon_address(client, address=None):
    """The TCP address ("host:port") of the daemon behind `client`: `address`,
    else $HSAP_ADDRESS, else the daemon's own answer (cluster_status()).
    HsapError(FAILED_PRECONDITION) naming HSAP_ADDRESS when none is known
    (a daemon without --port has no address peers could reach)."""
    if address is not None:
        return check_address(address, "address")
    env = os.environ.get(ADDRESS_ENV)
    if env:
        return check_address(env, f"${ADDRESS_ENV}")
    status = client.cluster_status()
    found = getattr(status, "self_address", "")  # newer daemons answer it directly
    if not found:
        found = next((n.address for n in status.nodes if n.node_rank == status.self_node_rank),
                     "")
    if not found:
        raise HsapError(grpc.StatusCode.FAILED_PRECONDITION,
                        f"the daemon at {client.socket_path} reports no TCP address (is it "
                        f"started with --port?); set ${ADDRESS_ENV}=host:port to the address "
                        "other nodes reach it at")
    return check_address(found, f"the TCP address reported by the daemon at {client.socket_path}")


def _env_int(name, env, low, high=None):
    value = env.get(name)
    if value is None:
        raise InvalidInputError(f"${name} is not set; run under torchrun (it sets "
                                f"{', '.join(_TORCHRUN_ENV)})")
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or n < low or (high is not None and n >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise InvalidInputError(f"${name} is {value!r}; it must be an integer in {bound}")
    return n


def _slot_from_env():
    value = os.environ.get("LOCAL_RANK")
    if value is None:
        return None
    return _env_int("LOCAL_RANK", os.environ, 0)


def plan_group(entries):
    """The group every rank derives from the gathered entries ("ok",
    address, slot, name or None, drawn name) of each pg rank: (name, nodes,
    ranks_per_node, pg_ranks) where pg_ranks[hsap rank] is that rank's pg
    rank. InvalidInputError when the ranks disagree on the name, the nodes
    hold different numbers of ranks or two ranks of a node give the same
    slot."""
    names = [e[3] for e in entries]
    if any(n is not None for n in names) and len(set(names)) > 1:
        given = ", ".join(f"pg rank {i}: {n!r}" for i, n in enumerate(names))
        raise InvalidInputError(f"the ranks give different group names ({given}); give the "
                                "same name on every rank, or None on every rank")
    group_name = names[0] if names[0] is not None else entries[0][4]
    on_node = {}  # address -> [pg ranks], in order of first appearance
    for pg_rank, entry in enumerate(entries):
        on_node.setdefault(entry[1], []).append(pg_rank)
    counts = {a: len(r) for a, r in on_node.items()}
    if len(set(counts.values())) != 1:
        listing = "; ".join(f"{a}: {len(r)} (pg ranks {', '.join(map(str, r))})"
                            for a, r in on_node.items())
        raise InvalidInputError(f"every node must hold the same number of ranks, but the ranks "
                                f"per daemon address are {listing}")
    pg_ranks = []
    for address, ranks in on_node.items():
        slots = [entries[r][2] for r in ranks]
        if any(s is None for s in slots) and not all(s is None for s in slots):
            listing = ", ".join(f"pg rank {r}: {entries[r][2]}" for r in ranks)
            raise InvalidInputError(f"on node {address} some ranks give a device slot "
                                    f"(LOCAL_RANK) and some do not ({listing})")
        if slots[0] is not None:
            seen = {}
            for r in ranks:
                slot = entries[r][2]
                if slot in seen:
                    raise InvalidInputError(
                        f"pg ranks {seen[slot]} and {r} both give device slot {slot} "
                        f"(LOCAL_RANK) on node {address}; give each rank of a node its own slot")
                seen[slot] = r
            ranks = sorted(ranks, key=lambda r: entries[r][2])
        pg_ranks.extend(ranks)
    return group_name, list(on_node), len(pg_ranks) // len(on_node), pg_ranks


def _gather(pg, mine):
    """all_gather_object of every rank's entry over pg; raises on every rank
    when any rank's entry is an ("error", code name, message): its own, else
    the first other rank's, naming that rank."""
    import torch.distributed as dist
    entries = [None] * dist.get_world_size(pg)
    dist.all_gather_object(entries, mine, group=pg)
    failed = [(i, e) for i, e in enumerate(entries) if e[0] == "error"]
    if failed:
        me = dist.get_rank(pg)
        i, (_, code, message) = next(((i, e) for i, e in failed if i == me), failed[0])
        if i != me:
            message = f"pg rank {i} could not join the group: {message}"
        raise HsapError(grpc.StatusCode[code], message)
    return entries


def _own_entry(client, name, address, local_slot):
    """This rank's ("ok", address, slot, name or None, drawn name)."""
    if name is not None and (not isinstance(name, str) or not 1 <= len(name.encode()) <= 128):
        raise InvalidInputError(f"group name {name!r} must be a string of 1 to 128 bytes")
    if local_slot is None:
        local_slot = _slot_from_env()
    elif not isinstance(local_slot, int) or local_slot < 0:
        raise InvalidInputError(f"local_slot is {local_slot!r}; it must be an int >= 0")
    return ("ok", daemon_address(client, address), local_slot, name, f"pg-{uuid.uuid4().hex}")


def from_process_group(pg=None, name=None, client=None, assignment="balanced", deadline_ms=0,
                       address=None, local_slot=None):
    """hsap.Group.from_process_group: see the module comment and Group."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise HsapError(grpc.StatusCode.FAILED_PRECONDITION,
                        "torch.distributed is not initialized: call "
                        "torch.distributed.init_process_group first, or hsap.init_from_env()")
    if pg is None:
        pg = dist.group.WORLD
    # A rank's own problem (no daemon, no address, a bad one, a bad slot or
    # name) is gathered too, so that every rank raises it instead of the
    # others waiting in the gather.
    try:
        client = client or default_client()
        mine = _own_entry(client, name, address, local_slot)
    except HsapError as e:
        mine = ("error", e.code.name, e.message)
    entries = _gather(pg, mine)
    pg_rank = dist.get_rank(pg)
    group_name, nodes, per_node, pg_ranks = plan_group(entries)
    rank = pg_ranks.index(pg_rank)
    group = Group(group_name, rank, len(pg_ranks), client=client, assignment=assignment,
                  deadline_ms=deadline_ms, nodes=nodes, node_index=rank // per_node)
    group.pg_rank = pg_rank
    group.pg_ranks = tuple(pg_ranks)
    return group


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
        _gather(dist.group.WORLD, ("error", e.code.name, e.message))
    try:
        return from_process_group(dist.group.WORLD, name, client, **group_options)
    except BaseException:
        client.close()
        raise

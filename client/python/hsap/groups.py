"""Groups: the collective an attention call belongs to, and how a group is
formed from a torch.distributed ProcessGroup.

    group = hsap.Group("layer-attn", rank=r, size=4, client=hsap.connect(sock))
    out = hsap.varlen_attn(q_local, k_local, v_local, cu_seqlens, max_seqlen, group=group)

    group = hsap.Group.from_process_group(cp_pg, client=hsap.connect())

Every call of hsapd is a collective (proto CallId): all `size` ranks of the
group submit the same call_seq and the call runs when all have arrived. The
Group numbers this rank's calls 1, 2, 3, ... — each forward and each backward
takes the next number — so every rank must make its calls of the group in the
same order. Calls of one Group object are serialised (a rank's calls are
sequential); give each rank its own Group object.

A call the daemon fails may or may not have used its number (a rank that never
arrived, a disagreement, an abort use it; a request rejected before it joined
the collective does not), so after a daemon error the Group refuses further
calls: the ranks should agree on a new group name, as with a failed NCCL
communicator. Errors found by the Python client before sending (bad shapes,
dtypes, ...) use no number and leave the Group usable.

Formation from a process group (Group.from_process_group) is one
all_gather_object over the process group: each rank contributes its
daemon's TCP address, its device slot and the name it asks for. Every rank
then derives the same group from the same gathered list:

* Nodes: the distinct daemon addresses, ordered by the first pg rank that
  names each one. Each node must hold the same number of ranks
  (InvalidInputError listing the counts otherwise, raised on every rank).
* Local rank: the ranks of one node ordered by their device slot (LOCAL_RANK
  under torchrun); without slots, by pg rank. hsapd runs local rank i on its
  device slot i (mod its slots).
* hsap rank = node_index * ranks_per_node + local rank (node-major, what the
  daemon requires). It equals the pg rank when the pg's ranks are already
  node-major with slots in pg rank order (torchrun's layout); otherwise it
  differs: hsap.shard and hsap.dispatch(group=...) take the rank from the
  group; `group.pg_ranks[r]` finds hsap rank r in the pg.
* Name: with name=None the group takes the name drawn by pg rank 0
  ("pg-<uuid4 hex>", so every formation is a new group, as a new NCCL
  communicator is); a given name must be the same on every rank.

The daemon's address: `address`, else $HSAP_ADDRESS ("host:port", exactly as
the daemon advertises it: --advertise_address, by default --host:--port),
else asked from the local daemon (GetClusterStatusResponse.self_address, or
this node's entry in its static cluster from an older daemon).

Layer: above hsap.client (the session), below the attention calls.
"""

import os
import threading
import uuid

import grpc

from hsap.client import HsapError, InvalidInputError, default_client

ADDRESS_ENV = "HSAP_ADDRESS"
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")

_ASSIGNMENTS = ("balanced", "contiguous", "zigzag")


class Group:
    """Identity of a collective: `name`, this caller's `rank` in [0, `size`).

    client: the session the calls go through (None: hsap.default_client()).
    assignment: token layout of the ranks, "balanced" (default), "contiguous"
      or "zigzag"; the same as given to hsap.dispatch.
    deadline_ms: every call must complete within this (0: the daemon's).
    nodes: the group's member daemons, by their TCP addresses exactly as
      they advertise them ("host:port": --advertise_address, by default
      --host:--port), in group node order; every rank passes
      the same list. The group then has size // len(nodes) ranks on each
      node (it must divide), numbered node-major: rank = node_index *
      ranks_per_node + local rank, and this rank's client must be the daemon
      nodes[node_index]. None (default): the group lives on one daemon
      (size <= its device slots) or spans its whole static cluster.
    node_index: this rank's node in `nodes` (default rank // ranks_per_node,
      the only value the daemon accepts).
    Also: ranks_per_node, local_rank (rank % ranks_per_node; hsapd runs it
    on its device slot local_rank mod its slots); for a group made by
    from_process_group, pg_rank (this rank in the process group), pg_ranks
    (pg_ranks[r]: the pg rank of group rank r) and process_group (the pg
    itself, which hsap.unshard gathers over); None otherwise.
    Counters of this rank's calls: call_seq, attention_seconds (wall time in
    the group's attention calls, forward and backward, staging included),
    last_stats (the daemon's CallStats of the last call: plan_key,
    strategy, bytes, wait and compute seconds).
    Thread-safe.
    """

    def __init__(self, name, rank, size, client=None, assignment="balanced", deadline_ms=0,
                 nodes=None, node_index=None):
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= 128:
            raise InvalidInputError(f"group name {name!r} must be a string of 1 to 128 bytes")
        if not isinstance(size, int) or size < 1:
            raise InvalidInputError(f"group size is {size!r}; it must be an int >= 1")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise InvalidInputError(f"group rank is {rank!r}; it must be in [0, size = {size})")
        if assignment not in _ASSIGNMENTS:
            raise InvalidInputError(
                f"unknown assignment {assignment!r}; it must be one of {', '.join(_ASSIGNMENTS)}")
        self.nodes, self.node_index = _check_nodes(nodes, node_index, rank, size)
        self.name = name
        self.rank = rank
        self.size = size
        self.client = client
        self.assignment = assignment
        self.deadline_ms = int(deadline_ms)
        self.ranks_per_node = size // len(self.nodes) if self.nodes else size
        self.local_rank = rank % self.ranks_per_node
        self.pg_rank = None
        self.pg_ranks = None
        self.process_group = None
        self.attention_seconds = 0.0
        self.last_stats = None
        self.generation = 0
        self.failed = None  # the HsapError that ended the group, if any
        self._last_seq = 0
        self._lock = threading.Lock()

    @classmethod
    def from_process_group(cls, pg=None, name=None, client=None, assignment="balanced",
                           deadline_ms=0, address=None, local_slot=None):
        """Forms the group of the ranks of the torch.distributed ProcessGroup
        `pg` (None: the default group), each rank with its local daemon
        (client, None: hsap.default_client()), by one all_gather_object over
        pg (a collective: every rank of pg calls it). See hsap.distributed:
        nodes ordered by their first pg rank, equal ranks per node, local
        ranks ordered by device slot (local_slot, else $LOCAL_RANK, else pg
        rank), rank = node_index * ranks_per_node + local rank (may differ
        from the pg rank: hsap.shard and hsap.dispatch(group=...) take the
        rank from the group).
        name=None: a new name ("pg-<uuid>", drawn by pg rank 0) for each
        formation; a name given must be the same on every rank. address:
        this daemon's TCP address, else $HSAP_ADDRESS, else asked from the
        daemon. Every rank raises the same InvalidInputError / HsapError
        when the ranks' declarations do not make a group."""
        return from_process_group(pg, name, client, assignment, deadline_ms, address,
                                  local_slot)

    @property
    def num_nodes(self):
        """The group's nodes (1 when it declared none; then it may still span
        the daemon's static cluster): hsap.dispatch's `nodes`."""
        return len(self.nodes) if self.nodes else 1

    @property
    def call_seq(self):
        """The call_seq of this rank's last call (0 before the first)."""
        return self._last_seq

    def check_usable(self):
        """Raises HsapError(FAILED_PRECONDITION) when a daemon error failed
        the group (a call can check before it stages anything)."""
        with self._lock:
            self._check_usable_locked()

    def _check_usable_locked(self):
        if self.failed is not None:
            raise HsapError(grpc.StatusCode.FAILED_PRECONDITION,
                            f"the group failed at call_seq {self._last_seq} "
                            f"({self.failed.code.name}: {self.failed.message}); use a new "
                            "group name", self.failed.socket_path, self.name, self.rank)

    def run(self, submit):
        """Calls submit(call_seq) with this rank's next call number, one call
        at a time; a daemon error marks the group failed and is re-raised."""
        with self._lock:
            self._check_usable_locked()
            self._last_seq += 1
            try:
                return submit(self._last_seq)
            except HsapError as e:
                self.failed = e.in_group(self.name, self.rank)
                raise

    def note_call(self, seconds, stats=None):
        """Adds one call's wall time (and keeps its CallStats) to the counters."""
        with self._lock:
            self.attention_seconds += seconds
            if stats is not None:
                self.last_stats = stats

    def __repr__(self):
        where = f", nodes={self.nodes}, node_index={self.node_index}" if self.nodes else ""
        return (f"Group({self.name!r}, rank={self.rank}, size={self.size}{where}, "
                f"call_seq={self._last_seq})")


def _check_nodes(nodes, node_index, rank, size):
    """(nodes tuple or None, node_index) of a Group, checked as the daemon
    would (it also checks its own entry against its advertised address)."""
    if nodes is None:
        if node_index not in (None, 0):
            raise InvalidInputError(f"node_index is {node_index!r} but nodes is None")
        return None, 0
    if isinstance(nodes, str) or not all(isinstance(n, str) and n for n in nodes):
        raise InvalidInputError(f"nodes is {nodes!r}; it must be a list of 'host:port' strings")
    nodes = tuple(nodes)
    if not nodes:
        raise InvalidInputError("nodes is empty; give None for a group without a node list")
    for i, n in enumerate(nodes):
        if n in nodes[:i]:
            raise InvalidInputError(f"nodes[{i}] {n!r} is the same node as nodes"
                                    f"[{nodes.index(n)}]; each node appears once")
    if size % len(nodes) != 0:
        raise InvalidInputError(f"group size {size} is not a multiple of len(nodes) = "
                                f"{len(nodes)}: every node holds the same number of ranks")
    per_node = size // len(nodes)
    if node_index is None:
        node_index = rank // per_node
    if not isinstance(node_index, int) or node_index != rank // per_node:
        raise InvalidInputError(f"node_index is {node_index!r} but rank {rank} with {per_node} "
                                f"rank(s) per node is on node {rank // per_node}")
    return nodes, node_index


_solo_lock = threading.Lock()


def solo_group(client):
    """The one-rank Group of `client`'s session (what group=None means in the
    attention calls): made on first use and kept on the client; replaced by
    a new one (a new name) after a daemon error failed it."""
    with _solo_lock:
        group = client._solo_group
        if group is None or group.failed is not None:
            gen = 0 if group is None else group.generation + 1
            group = Group(f"py-{client.session_id}-solo-{gen}", 0, 1, client=client)
            group.generation = gen
            client._solo_group = group
        return group


# --- formation from a torch.distributed ProcessGroup ------------------------


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
        mine = ("error", e.code.name, e.located_message)
    entries = _gather(pg, mine)
    pg_rank = dist.get_rank(pg)
    group_name, nodes, per_node, pg_ranks = plan_group(entries)
    rank = pg_ranks.index(pg_rank)
    group = Group(group_name, rank, len(pg_ranks), client=client, assignment=assignment,
                  deadline_ms=deadline_ms, nodes=nodes, node_index=rank // per_node)
    group.pg_rank = pg_rank
    group.pg_ranks = tuple(pg_ranks)
    group.process_group = pg
    return group

"""Groups: the collective an attention call belongs to.

    group = hsap.Group("layer-attn", rank=r, size=4, client=hsap.connect(sock))
    out = hsap.varlen_attn(q_local, k_local, v_local, cu_seqlens, max_seqlen, group=group)

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
"""

import threading

import grpc

from hsap.errors import HsapError, InvalidInputError

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
    from_process_group, pg_rank (this rank in the process group) and
    pg_ranks (pg_ranks[r]: the pg rank of group rank r); None otherwise.
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
        from the pg rank: then use group.rank for hsap.dispatch's layout).
        name=None: a new name ("pg-<uuid>", drawn by pg rank 0) for each
        formation; a name given must be the same on every rank. address:
        this daemon's TCP address, else $HSAP_ADDRESS, else asked from the
        daemon. Every rank raises the same InvalidInputError / HsapError
        when the ranks' declarations do not make a group."""
        from hsap.distributed import from_process_group
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

    def run(self, submit):
        """Calls submit(call_seq) with this rank's next call number, one call
        at a time; a daemon error marks the group failed and is re-raised."""
        with self._lock:
            if self.failed is not None:
                raise HsapError(grpc.StatusCode.FAILED_PRECONDITION,
                                f"group '{self.name}' (rank {self.rank}) failed at call_seq "
                                f"{self._last_seq} ({self.failed}); use a new group name")
            self._last_seq += 1
            try:
                return submit(self._last_seq)
            except HsapError as e:
                self.failed = e
                raise

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

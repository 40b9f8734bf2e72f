"""A session with hsapd: the session socket, memfd regions, the gRPC stubs.

    client = hsap.connect()                 # $HSAP_SOCKET or /run/hsap/hsapd.sock
    region = client.create_region(1 << 20, "scratch")
    t = region.view(0, (128, 4, 64), torch.float32)   # a tensor over the memfd
    client.close()                          # the daemon drops the regions

Protocol (proto/README.md, "Sessions and regions"): connect to
`<socket>.session` (SOCK_SEQPACKET), read the SessionHello, pass each memfd as
a SessionFdTransfer with the fd attached (SCM_RIGHTS) and read its
SessionFdAck, then call gRPC on `unix:<socket>` with the metadata
`hsap-session-id` / `hsap-session-token`. The session lasts as long as the
session connection.

Attention calls stage their tensors in per-session *arenas*: registered
regions that are checked out for one call, returned afterwards and reused
(grown by replacing them with a larger region when a call needs more), so a
training loop registers a handful of regions, not one per call. A Client is
thread-safe: concurrent calls (for instance several ranks of a group sharing
one client) each check out their own arena.

This is the bottom layer of the package: it imports no other hsap module
(only the generated hsap.v1 protos, grpc and torch), so it holds the
exception classes every layer raises (hsap.errors re-exports them). The
layers above: hsap.groups (collectives), hsap.masks / attention / flash /
plans (the calls), hsap.sharding and hsap.nn (layouts and the module),
hsap.distributed (torchrun); tests/layering_test.py keeps them acyclic.

Deadlines: no call waits for the daemon without bound, so a daemon that
stops answering (SIGSTOP, a deadlock) fails the trainer's call instead of
hanging it. Attention.Forward/Backward carry a gRPC timeout of the request's
`deadline_ms` (0: `default_deadline_ms`, the daemon's default
--call_deadline_ms of 60 s) plus `deadline_margin_s` (5 s): the daemon
answers a call that runs out of time itself (DEADLINE_EXCEEDED naming the
missing ranks) before the margin is over, so the client's own deadline only
fires when the daemon does not answer at all. Every other call, and every
blocking send/receive on the session socket (connect, the hello, fd
transfers and their acks), has `timeout_s` (30 s). The three are options of
connect() / Client(), defaulting to DEFAULT_DEADLINE_MS, DEADLINE_MARGIN_S
and DEFAULT_TIMEOUT_S as they are when the client is made.

Errors: every error the client raises is an `HsapError`, with `.code` (a
`grpc.StatusCode`) and `.message`, and where the call went: `.socket_path`
(the daemon's gRPC socket), `.group` and `.rank` (for calls of a group);
str(error) leads with them, e.g.
"hsapd at /tmp/x/hsapd.sock, group 'g' rank 3: DEADLINE_EXCEEDED: ...":

* errors from the daemon keep its code and message (`INVALID_ARGUMENT` names
  the field and values, `DEADLINE_EXCEEDED` names the missing ranks, ...);
* the client's own deadline is DEADLINE_EXCEEDED "no answer from hsapd
  within ..." (the seconds and what they are made of); a daemon that died
  or never listened is UNAVAILABLE;
* problems found at the Python entry point, before anything is sent, are
  `InvalidInputError` (code `INVALID_ARGUMENT`), which is also a `ValueError`;
  a wrong dtype is `InvalidDTypeError`, also a `TypeError`.
"""

import array
import mmap
import os
import socket
import threading
import time
import weakref

import grpc
import torch

from hsap.v1 import attention_pb2_grpc
from hsap.v1 import cluster_pb2
from hsap.v1 import cluster_pb2_grpc
from hsap.v1 import plans_pb2_grpc
from hsap.v1 import regions_pb2
from hsap.v1 import regions_pb2_grpc

DEFAULT_SOCKET = "/run/hsap/hsapd.sock"
# Seconds every call but the attention calls, and every blocking operation
# on the session socket, may take before the client gives up.
DEFAULT_TIMEOUT_S = 30.0
# Seconds an attention call may run past its deadline_ms before the client
# gives up on the daemon: time for the daemon's own DEADLINE_EXCEEDED (or its
# answer) to arrive.
DEADLINE_MARGIN_S = 5.0
# The deadline of an attention call whose deadline_ms is 0: the daemon's
# default --call_deadline_ms. A daemon started with a longer one needs
# connect(default_deadline_ms=...) or a Group(deadline_ms=...).
DEFAULT_DEADLINE_MS = 60000
_ALIGN = 64
_MIN_ARENA_BYTES = 1 << 20


class HsapError(Exception):
    """An HSAP call failed. `code`: grpc.StatusCode; `message`: what and why.

    Where the call went, None when unknown or not applicable: `socket_path`,
    the daemon's gRPC socket; `group` and `rank`, the collective of the call.
    str() leads with them: "hsapd at <socket>, group '<g>' rank <r>: CODE: message".
    `no_answer`: True when the daemon did not answer (the client's deadline
    passed, the connection failed): the call may still run there.
    """

    def __init__(self, code, message, socket_path=None, group=None, rank=None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.socket_path = socket_path
        self.group = group
        self.rank = rank
        self.no_answer = False

    @property
    def where(self):
        """The place of the call, e.g. "hsapd at <socket>, group '<g>' rank <r>"
        (the parts known), or the empty string."""
        parts = []
        if self.socket_path is not None:
            parts.append(f"hsapd at {self.socket_path}")
        if self.group is not None:
            parts.append(f"group '{self.group}' rank {self.rank}")
        return ", ".join(parts)

    @property
    def located_message(self):
        """The message prefixed with `where` (for errors passed on as text)."""
        return f"{self.where}: {self.message}" if self.where else self.message

    def in_group(self, group, rank):
        """Records the call's group and rank when the error has none yet (an
        error of the staging of a group's call); returns self."""
        if self.group is None and self.socket_path is not None:
            self.group, self.rank = group, rank
        return self

    def __str__(self):
        text = f"{self.code.name}: {self.message}"
        return f"{self.where}: {text}" if self.where else text

    def __reduce__(self):  # pickles (multiprocessing queues) with every field
        return (type(self), (self.code, self.message), dict(self.__dict__))


class InvalidInputError(HsapError, ValueError):
    """An argument failed validation in the Python client (nothing was sent)."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)

    def __reduce__(self):
        return (type(self), (self.message,), dict(self.__dict__))


class InvalidDTypeError(InvalidInputError, TypeError):
    """A tensor has a dtype the call does not take."""


def from_rpc_error(error, socket_path=None, group=None, rank=None):
    """The HsapError for a grpc.RpcError raised by a stub call (sent to the
    daemon at `socket_path`, for `group`'s `rank` when given)."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    return HsapError(code, details or "", socket_path, group, rank)


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class Region:
    """A memfd mapped in this process and registered with the daemon.

    `tensor` is a flat uint8 torch tensor over the whole mapping; `view`
    cuts typed tensors out of it (no copy: the daemon reads and writes the
    same pages).
    """

    def __init__(self, region_id, size, mapping, name):
        self.region_id = region_id
        self.size = size
        self.name = name
        self._mapping = mapping
        self.tensor = torch.frombuffer(mapping, dtype=torch.uint8)

    def view(self, offset, shape, dtype):
        """A `dtype` tensor of `shape` at byte `offset` (REQUIRES: it fits)."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if offset + nbytes > self.size:
            raise ValueError(f"view [{offset}, {offset + nbytes}) exceeds region of {self.size} bytes")
        return self.tensor[offset:offset + nbytes].view(dtype).view(tuple(shape))


class Arena:
    """A Region checked out for one call: tensors at 64-byte aligned offsets."""

    def __init__(self, region):
        self.region = region


class Client:
    """One session with hsapd. Use `connect()` to make one; `close()` ends it.

    timeout_s: seconds each call but Attention.Forward/Backward, and each
      blocking operation on the session socket, may take (None:
      DEFAULT_TIMEOUT_S).
    deadline_margin_s: seconds an attention call may take beyond its
      deadline_ms (None: DEADLINE_MARGIN_S).
    default_deadline_ms: the deadline of an attention call whose deadline_ms
      is 0, the daemon's --call_deadline_ms (None: DEFAULT_DEADLINE_MS).
    A call that exceeds its time raises HsapError(DEADLINE_EXCEEDED).
    """

    def __init__(self, socket_path, timeout_s=None, deadline_margin_s=None,
                 default_deadline_ms=None):
        self.socket_path = socket_path
        self.timeout_s = _positive("timeout_s", DEFAULT_TIMEOUT_S if timeout_s is None
                                   else timeout_s)
        self.deadline_margin_s = _positive("deadline_margin_s", DEADLINE_MARGIN_S
                                           if deadline_margin_s is None else deadline_margin_s,
                                           allow_zero=True)
        self.default_deadline_ms = int(_positive(
            "default_deadline_ms",
            DEFAULT_DEADLINE_MS if default_deadline_ms is None else default_deadline_ms))
        session_path = socket_path + ".session"
        self._session_path = session_path
        self._session = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Bounds connect, the hello and every fd transfer: a stopped daemon
        # leaves them waiting otherwise (the kernel accepts the connection
        # and buffers the transfers for it).
        self._session.settimeout(self.timeout_s)
        try:
            self._session.connect(session_path)
            data = self._session.recv(4096)
        except OSError as e:
            self._session.close()
            if isinstance(e, socket.timeout):
                raise self._error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"no session hello on {session_path} within "
                                  f"{self.timeout_s:g} s (timeout_s): the daemon is stopped, "
                                  "deadlocked or overloaded") from None
            raise self._error(grpc.StatusCode.UNAVAILABLE,
                              f"no hsapd session socket at {session_path}: "
                              f"{e.strerror or e}") from None
        if not data:
            self._session.close()
            raise self._error(grpc.StatusCode.UNAVAILABLE,
                              f"hsapd at {session_path} closed the session without a hello "
                              "(is this user allowed?)")
        hello = regions_pb2.SessionHello.FromString(data)
        if hello.code != 0:
            self._session.close()
            raise self._error(_status_code(hello.code),
                              f"the daemon refused the session on {session_path}: "
                              f"{hello.message}")
        self.session_id = hello.session_id
        self.daemon_version = hello.daemon_version
        self._metadata = (("hsap-session-id", str(hello.session_id)),
                          ("hsap-session-token", hello.session_token))
        self._channel = grpc.insecure_channel("unix:" + socket_path)
        self._regions = regions_pb2_grpc.RegionsStub(self._channel)
        self._attention = attention_pb2_grpc.AttentionStub(self._channel)
        self._plans = plans_pb2_grpc.PlansStub(self._channel)
        self._cluster = cluster_pb2_grpc.ClusterStub(self._channel)
        self._session_lock = threading.Lock()
        self._next_transfer_id = 1
        self._arena_lock = threading.Lock()
        self._free_arenas = []
        self._arena_count = 0
        self._solo_group = None  # this session's one-rank Group (hsap.groups.solo_group)
        self._shared = {}  # region_id -> Region of a tensor made by empty()
        self._dead_shared = []  # region ids whose tensor was collected
        self.copied_bytes = 0  # bytes attention calls copied into arenas
        self._closed = False

    def _error(self, code, message, group=None, rank=None):
        """An HsapError that names this client's daemon (and the group)."""
        return HsapError(code, message, self.socket_path, group, rank)

    # --- lifetime -----------------------------------------------------------

    def close(self):
        """Ends the session: the daemon unregisters every region of it."""
        if self._closed:
            return
        self._closed = True
        self._free_arenas = []
        self._channel.close()
        self._session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- regions ------------------------------------------------------------

    def pass_fd(self, fd):
        """Passes `fd` on the session socket; returns its transfer id.
        HsapError DEADLINE_EXCEEDED when the daemon does not acknowledge it
        within timeout_s, UNAVAILABLE when the session is gone."""
        with self._session_lock:
            transfer_id = self._next_transfer_id
            self._next_transfer_id += 1
            msg = regions_pb2.SessionFdTransfer(transfer_id=transfer_id).SerializeToString()
            try:
                self._session.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                               array.array("i", [fd]))])
                while True:
                    data = self._session.recv(4096)
                    if not data:
                        raise self._error(grpc.StatusCode.UNAVAILABLE,
                                          f"hsapd closed the session ({self._session_path})")
                    ack = regions_pb2.SessionFdAck.FromString(data)
                    # Acks come in transfer order; an older one is the late
                    # ack of a transfer whose wait timed out.
                    if ack.transfer_id >= transfer_id:
                        break
            except socket.timeout:
                raise self._error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"no ack of fd transfer {transfer_id} on "
                                  f"{self._session_path} within {self.timeout_s:g} s "
                                  "(timeout_s): the daemon is stopped, deadlocked or "
                                  "overloaded") from None
            except OSError as e:
                raise self._error(grpc.StatusCode.UNAVAILABLE,
                                  f"session socket {self._session_path}: {e}") from None
        if ack.code != 0:
            raise self._error(_status_code(ack.code), ack.message)
        return transfer_id

    def create_region(self, size, name):
        """Creates a memfd of `size` bytes, maps it here and registers it."""
        fd = os.memfd_create("hsap-" + name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)  # hsapd seals it against shrinking
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
            transfer_id = self.pass_fd(fd)
        finally:
            os.close(fd)  # the mapping and the daemon's copy keep the memory
        resp = self._call(self._regions.RegisterRegion, regions_pb2.RegisterRegionRequest(
            name=name, memfd=regions_pb2.MemfdSource(transfer_id=transfer_id), size_bytes=size))
        return Region(resp.region_id, size, mapping, name)

    def unregister(self, region_id):
        self._call(self._regions.UnregisterRegion,
                   regions_pb2.UnregisterRegionRequest(region_id=region_id))

    def list_regions(self):
        return self._call(self._regions.ListRegions, regions_pb2.ListRegionsRequest())

    # --- raw calls (requests from hsap.v1; errors become HsapError) ---------

    def forward(self, request):
        return self._call(self._attention.Forward, request, self.attention_timeout(request))

    def backward(self, request):
        return self._call(self._attention.Backward, request, self.attention_timeout(request))

    def plans_dispatch(self, request):
        return self._call(self._plans.Dispatch, request)

    def show_plan(self, request):
        """Plans.ShowPlan (a plans_pb2.ShowPlanRequest): NOT_FOUND for a key
        the daemon has not cached."""
        return self._call(self._plans.ShowPlan, request)

    def cluster_status(self):
        """The daemon's GetClusterStatusResponse (this node and, on a
        cluster, every node with its TCP address and state)."""
        return self._call(self._cluster.GetClusterStatus, cluster_pb2.GetClusterStatusRequest())

    def attention_timeout(self, request):
        """(seconds, what they are) of the client's deadline for an attention
        request: its options.deadline_ms (0: default_deadline_ms) plus
        deadline_margin_s."""
        deadline_ms = request.options.deadline_ms
        which = f"the call's deadline_ms {deadline_ms}"
        if deadline_ms == 0:
            deadline_ms = self.default_deadline_ms
            which = f"the daemon's default deadline {deadline_ms} ms"
        return (deadline_ms / 1000.0 + self.deadline_margin_s,
                f"{which} + margin {self.deadline_margin_s:g} s")

    def _call(self, method, request, timeout=None):
        """method(request) with the session metadata and a gRPC timeout:
        timeout = (seconds, what they are), default (timeout_s, ...). A
        request with a CallId (`call`) names its group and rank in errors."""
        call_id = getattr(request, "call", None)
        group = call_id.group if call_id is not None else None
        rank = call_id.rank if call_id is not None else None
        if self._closed:
            raise self._error(grpc.StatusCode.FAILED_PRECONDITION, "the client is closed",
                              group, rank)
        seconds, what = timeout or (self.timeout_s, "timeout_s")
        started = time.monotonic()
        try:
            return method(request, metadata=self._metadata, timeout=seconds)
        except grpc.RpcError as e:
            error = from_rpc_error(e, self.socket_path, group, rank)
        elapsed = time.monotonic() - started
        if error.code == grpc.StatusCode.DEADLINE_EXCEEDED and elapsed >= seconds:
            # The client's own deadline, not the daemon's answer.
            error.message = (f"no answer from hsapd within {seconds:g} s ({what}); the daemon "
                             f"is stopped, deadlocked or overloaded (gRPC: {error.message})")
            error.no_answer = True
        elif error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            error.no_answer = True
        raise error

    # --- tensors in shared memory (referenced in place) ----------------------

    def empty(self, shape, dtype=torch.float32, name="py-tensor"):
        """An uninitialised CPU tensor in a region of its own, registered with
        the daemon: attention calls of this client that take it as q, k or v
        reference it in place instead of copying it into an arena. Once the
        tensor object is collected its region is unregistered (at the
        client's next call); views that outlive it stay valid here and are
        simply copied again."""
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self._reap_shared()
        region = self.create_region(max(_align(nbytes), _ALIGN), name)
        tensor = region.view(0, tuple(shape), dtype)
        with self._arena_lock:
            self._shared[region.region_id] = region
        weakref.finalize(tensor, self._shared_tensor_died, region.region_id)
        return tensor

    def locate(self, tensor):
        """(region, byte offset) when `tensor` (contiguous) lies inside a
        region made by empty(), else None."""
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        with self._arena_lock:
            for region in self._shared.values():
                base = region.tensor.data_ptr()
                if base <= start and end <= base + region.size:
                    return region, start - base
        return None

    def _shared_tensor_died(self, region_id):
        # Runs inside garbage collection: no RPC here, just note it.
        with self._arena_lock:
            if self._shared.pop(region_id, None) is not None:
                self._dead_shared.append(region_id)

    def _reap_shared(self):
        with self._arena_lock:
            dead, self._dead_shared = self._dead_shared, []
        for region_id in dead:
            try:
                self.unregister(region_id)
            except HsapError:
                pass  # e.g. the session ended; nothing left to release

    # --- arenas -------------------------------------------------------------

    def checkout_arena(self, nbytes):
        """An arena of at least `nbytes` for one call; give it back with
        `checkin_arena`. Reuses a free one; replaces one that is too small by
        a larger region (at least double), or registers a new one."""
        self._reap_shared()
        with self._arena_lock:
            fits = [a for a in self._free_arenas if a.region.size >= nbytes]
            if fits:
                arena = min(fits, key=lambda a: a.region.size)
                self._free_arenas.remove(arena)
                return arena
            old = self._free_arenas.pop() if self._free_arenas else None
            self._arena_count += 1
            name = f"py-arena-{self._arena_count}"
        size = max(_MIN_ARENA_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())
        if old is not None:
            size = max(size, 2 * old.region.size)
            self.unregister(old.region.region_id)  # not in use: it was free
        return Arena(self.create_region(size, name))

    def checkin_arena(self, arena):
        with self._arena_lock:
            if not self._closed:
                self._free_arenas.append(arena)

    def abandon_arena(self, arena):
        """Instead of checkin_arena for a call the daemon did not answer (it
        may still write the arena): the arena is never reused; its region is
        unregistered at the next checkout (and stays registered until the
        session ends if the daemon still holds it then)."""
        with self._arena_lock:
            self._dead_shared.append(arena.region.region_id)


def _status_code(value):
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def _positive(name, value, allow_zero=False):
    """float(value) when it is a finite number > 0 (>= 0 with allow_zero),
    else InvalidInputError naming it."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number != number or number == float("inf") or number < 0 or (
            number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInputError(f"{name} is {value!r}; it must be a finite number {bound}")
    return number


def connect(socket_path=None, timeout_s=None, deadline_margin_s=None, default_deadline_ms=None):
    """Opens a session with hsapd at `socket_path`, else $HSAP_SOCKET, else
    /run/hsap/hsapd.sock. HsapError(UNAVAILABLE) when nobody listens there,
    DEADLINE_EXCEEDED when it does not answer within timeout_s. The
    deadline options: see Client."""
    if socket_path is None:
        socket_path = os.environ.get("HSAP_SOCKET") or DEFAULT_SOCKET
    return Client(socket_path, timeout_s, deadline_margin_s, default_deadline_ms)


_default_lock = threading.Lock()
_default_client = None


def default_client():
    """The process's shared client, connected on first use (see connect())."""
    global _default_client
    with _default_lock:
        if _default_client is None or _default_client._closed:
            _default_client = connect()
        return _default_client

"""Attention masks as slices (DESIGN.md §2, common/mask.h): every mask hsapd
computes is a list of rectangles [q_begin, q_end) x [k_begin, k_end) of the
query x key matrix, each FULL or CAUSAL. In a CAUSAL slice query i sees key j
when, with d = (i - q_begin + offset) - (j - k_begin), d >= 0 and, when
window >= 0, d <= window. Rectangles may not overlap.

    m = hsap.masks.documents(cu_seqlens, causal=[True, False, True])   # per document
    m = hsap.masks.varlen(cu_seqlens_q, cu_seqlens_k, causal=True,     # flash-attention's
                          window_size=(128, 0))                         # bottom-right rule
    m = hsap.masks.shared_prefix([(prompt_len, [answer_len, ...]), ...])
    m = hsap.masks.magi(q_ranges, k_ranges, attn_type_map)              # MagiAttention's
    m = hsap.masks.from_slices([(0, 64, 0, 64, "causal", 0, -1)], 64)
    out = hsap.masked_attn(q, k, v, m)          # or hsap.dispatch(m, world_size=...)

A Mask covers num_q query rows and num_k key rows. Calls of one-rank groups
take any num_q and num_k; groups of several ranks hold one token space, so
their masks need num_q == num_k (the query and key row of a token live on the
same rank).

Lowerings (each exact; tests/masks_test.py checks them against dense masks
built from the definitions):
  * flash-attention varlen, document b with Lq queries and Lk keys, s = Lk -
    Lq (bottom-right alignment), window (left, right), -1 = unlimited:
    query i sees key j iff j <= i + s + right and j >= i + s - left (and
    causal means right = 0). As a slice: FULL when both sides are unlimited;
    else CAUSAL with offset = s + right (right unlimited: offset = Lk, a bound
    that never binds) and window = offset - s + left (left unlimited: none).
  * MagiAttention's four types on (q_range, k_range), r and u the query and
    key index inside the slice, s = Lk - Lq: full (all), causal (u <= r + s:
    CAUSAL offset s), inv-causal (u >= r: CAUSAL offset Lk, window Lk),
    bi-causal (r <= u <= r + s: CAUSAL offset s, window s; empty when s < 0).
"""

from collections import namedtuple

import torch

from hsap.errors import InvalidInputError
from hsap.v1 import attention_pb2
from hsap.v1 import common_pb2

FULL = "full"
CAUSAL = "causal"
# |offset| and window are bounded by the daemon (common/mask.cc ValidateSlices).
_LIMIT = 1 << 48


class Slice(namedtuple("Slice", "q_begin q_end k_begin k_end type offset window")):
    """One rectangle with its rule: type "full" or "causal"; offset and window
    (-1: none) apply to "causal" only."""

    __slots__ = ()

    def allows(self, i, j):
        """Whether global query row i sees global key j (both inside the
        rectangle). The rule of common/mask.h, for references and tests."""
        if self.type == FULL:
            return True
        d = (i - self.q_begin + self.offset) - (j - self.k_begin)
        return d >= 0 and (self.window < 0 or d <= self.window)


def _int(value, name):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
            return int(value)
        try:
            import numpy
            if isinstance(value, numpy.integer):
                return int(value)
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        raise InvalidInputError(f"{name} is {value!r}; it must be an int")
    return value


def _make_slice(values, index):
    """A Slice from a Slice, or a tuple (q_begin, q_end, k_begin, k_end[,
    type[, offset[, window]]]) with type "full"/"causal" (default "full")."""
    if isinstance(values, Slice):
        return values
    try:
        items = list(values)
    except TypeError:
        raise InvalidInputError(f"slices[{index}] is {values!r}; it must be a tuple (q_begin, "
                                "q_end, k_begin, k_end, type, offset, window)") from None
    if not 4 <= len(items) <= 7:
        raise InvalidInputError(f"slices[{index}] has {len(items)} entries; it must be (q_begin, "
                                "q_end, k_begin, k_end[, type[, offset[, window]]])")
    qb, qe, kb, ke = (_int(x, f"slices[{index}][{n}]") for n, x in enumerate(items[:4]))
    kind = items[4] if len(items) > 4 else FULL
    if kind not in (FULL, CAUSAL):
        raise InvalidInputError(f"slices[{index}] type is {kind!r}; it must be 'full' or 'causal'")
    offset = _int(items[5], f"slices[{index}].offset") if len(items) > 5 else 0
    window = _int(items[6], f"slices[{index}].window") if len(items) > 6 else -1
    return Slice(qb, qe, kb, ke, kind, offset, window)


def _check_no_overlap(slices):
    """Rectangles of non-empty slices must be disjoint (a pair would count twice)."""
    order = sorted((s for s in slices if s.q_end > s.q_begin and s.k_end > s.k_begin),
                   key=lambda s: (s.q_begin, s.k_begin))
    active = []
    for s in order:
        active = [a for a in active if a.q_end > s.q_begin]
        for a in active:
            if a.k_begin < s.k_end and s.k_begin < a.k_end:
                raise InvalidInputError(f"slices {tuple(a)} and {tuple(s)} overlap: a mask's "
                                        "rectangles must be disjoint")
        active.append(s)


class Mask:
    """Slices over [0, num_q) x [0, num_k), validated (bounds, types, no
    overlap). Immutable; build one with the functions of this module."""

    def __init__(self, slices, num_q, num_k=None, documents=None):
        num_q = _int(num_q, "num_q")
        num_k = num_q if num_k is None else _int(num_k, "num_k")
        if num_q < 0 or num_k < 0:
            raise InvalidInputError(f"num_q/num_k are {num_q}/{num_k}; they must be >= 0")
        checked = []
        for i, raw in enumerate(slices):
            s = _make_slice(raw, i)
            if not 0 <= s.q_begin <= s.q_end <= num_q:
                raise InvalidInputError(f"slices[{i}] query range [{s.q_begin}, {s.q_end}) is not "
                                        f"within [0, {num_q})")
            if not 0 <= s.k_begin <= s.k_end <= num_k:
                raise InvalidInputError(f"slices[{i}] key range [{s.k_begin}, {s.k_end}) is not "
                                        f"within [0, {num_k})")
            if s.type == FULL and (s.offset != 0 or s.window >= 0):
                raise InvalidInputError(f"slices[{i}] is 'full' but has offset {s.offset} / "
                                        f"window {s.window}: only 'causal' slices take them")
            if abs(s.offset) > _LIMIT or s.window > _LIMIT or s.window < -1:
                raise InvalidInputError(f"slices[{i}] offset {s.offset} / window {s.window}: "
                                        "|offset| and window must be at most 2^48, window >= -1")
            if s.q_end > s.q_begin and s.k_end > s.k_begin:
                checked.append(s)
        _check_no_overlap(checked)
        self.slices = tuple(sorted(checked, key=lambda s: (s.q_begin, s.k_begin)))
        self.num_q = num_q
        self.num_k = num_k
        # (cu_seqlens, causal, window_left) when the mask is exactly packed
        # documents: sent in that compact form (plans are then keyed as
        # hsap.dispatch(cu_seqlens, ...) keys them).
        self._documents = documents

    def __repr__(self):
        return f"Mask(num_q={self.num_q}, num_k={self.num_k}, slices={len(self.slices)})"

    def __eq__(self, other):
        return (isinstance(other, Mask) and self.slices == other.slices and
                self.num_q == other.num_q and self.num_k == other.num_k)

    def __hash__(self):
        return hash((self.slices, self.num_q, self.num_k))

    @property
    def is_square(self):
        return self.num_q == self.num_k

    def dense(self, device=None):
        """Bool [num_q, num_k]: (i, j) is True when query i sees key j. For
        references and tests (O(num_q * num_k) memory)."""
        allowed = torch.zeros(self.num_q, self.num_k, dtype=torch.bool, device=device)
        for s in self.slices:
            r = torch.arange(s.q_end - s.q_begin, device=device)[:, None]
            c = torch.arange(s.k_end - s.k_begin, device=device)[None, :]
            if s.type == FULL:
                block = torch.ones(len(r), c.shape[1], dtype=torch.bool, device=device)
            else:
                d = r + s.offset - c
                block = d >= 0
                if s.window >= 0:
                    block &= d <= s.window
            allowed[s.q_begin:s.q_end, s.k_begin:s.k_end] = block
        return allowed

    def area(self):
        """Allowed (query, key) pairs."""
        return int(self.dense().sum()) if self.slices else 0

    # --- wire forms -------------------------------------------------------

    def _proto_slices(self):
        out = []
        for s in self.slices:
            m = common_pb2.MaskSlice(q_begin=s.q_begin, q_end=s.q_end, k_begin=s.k_begin,
                                     k_end=s.k_end)
            if s.type == CAUSAL:
                m.type = common_pb2.MASK_TYPE_CAUSAL
                m.offset = s.offset
                m.window = s.window
            else:
                m.type = common_pb2.MASK_TYPE_FULL
                # Always set: Plans.Dispatch reads an unset window as 0
                # (server/plan/plan_proto.cc), the attention calls as -1.
                m.window = -1
            out.append(m)
        return out

    def mask_spec(self, total_tokens=None):
        """The proto MaskSpec over a token space of `total_tokens` rows
        (default num_q; REQUIRES num_q, num_k <= total_tokens)."""
        total = self.num_q if total_tokens is None else total_tokens
        if self._documents is not None and total == self.num_q == self.num_k:
            cu, causal, window = self._documents
            spec = attention_pb2.MaskSpec(
                cu_seqlens=attention_pb2.CuSeqlens(inline_values=attention_pb2.Int64List(values=cu)),
                causal=causal)
            if causal and window >= 0:
                spec.window_left = window
            return spec
        return attention_pb2.MaskSpec(slices=attention_pb2.MaskSlices(
            slices=self._proto_slices(), total_tokens=total))

    def plan_spec_fields(self):
        """The mask fields of a plan_pb2.PlanSpec (REQUIRES is_square)."""
        if self._documents is not None:
            cu, causal, window = self._documents
            return dict(cu_seqlens=cu, causal=causal, window=window if causal else -1,
                        total_tokens=self.num_q)
        return dict(slices=self._proto_slices(), window=-1, total_tokens=self.num_q)


# --- building masks ---------------------------------------------------------

def cu_seqlens_values(cu_seqlens, name="cu_seqlens"):
    """cu_seqlens as a list of ints, checked: 1-D integers, starts at 0,
    non-decreasing. Raises InvalidInputError / InvalidDTypeError."""
    from hsap.errors import InvalidDTypeError
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise InvalidDTypeError(f"{name}.dtype is {cu_seqlens.dtype}; it must be torch.int32 "
                                    "or torch.int64")
        if cu_seqlens.dim() != 1:
            raise InvalidInputError(f"{name} has shape {list(cu_seqlens.shape)}; it must be 1-D")
        values = cu_seqlens.detach().cpu().tolist()
    else:
        try:
            raw = list(cu_seqlens)
        except TypeError:
            raise InvalidInputError(f"{name} must be a 1-D integer tensor or a sequence of ints, "
                                    f"not {type(cu_seqlens).__name__}") from None
        if any(isinstance(x, float) for x in raw):
            raise InvalidDTypeError(f"{name} holds floats; it must hold integers")
        try:
            values = [int(x) for x in raw]
        except (TypeError, ValueError):
            raise InvalidInputError(f"{name} must be a 1-D integer tensor or a sequence of ints, "
                                    f"not {type(cu_seqlens).__name__}") from None
    if len(values) < 1:
        raise InvalidInputError(f"{name} is empty; it needs at least [0]")
    if values[0] != 0:
        raise InvalidInputError(f"{name}[0] is {values[0]}; it must be 0")
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise InvalidInputError(f"{name} decreases at index {i} ({values[i - 1]} -> "
                                    f"{values[i]}); it must be non-decreasing")
    return values


def window_pair(window_size):
    """(left, right) ints >= -1 from flash-attention's window_size."""
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        raise InvalidInputError(f"window_size is {window_size!r}; it must be a pair "
                                "(left, right)") from None
    if left < -1 or right < -1:
        raise InvalidInputError(f"window_size is {tuple(window_size)}; entries must be >= -1 "
                                "(-1 = unlimited)")
    return left, right


def document_slice(q_begin, q_end, k_begin, k_end, causal, left=-1, right=-1):
    """The slice of one flash-attention document (bottom-right alignment,
    window (left, right), causal meaning right = 0); None when it allows no
    pair because a side is empty."""
    lq, lk = q_end - q_begin, k_end - k_begin
    if lq <= 0 or lk <= 0:
        return None
    if causal:
        right = 0
    s = lk - lq
    # Bounds that cannot bind are unlimited: j >= i + s - left holds for
    # every key when it holds for the last row (i = lq - 1, j = 0):
    # left >= lk - 1; j <= i + s + right holds for every key when it holds
    # for the first row (i = 0, j = lk - 1): right >= lq - 1.
    if left >= 0 and left >= lk - 1:
        left = -1
    if right >= 0 and right >= lq - 1:
        right = -1
    if left < 0 and right < 0:
        return Slice(q_begin, q_end, k_begin, k_end, FULL, 0, -1)
    offset = lk if right < 0 else s + right
    window = -1 if left < 0 else offset - s + left
    return Slice(q_begin, q_end, k_begin, k_end, CAUSAL, offset, window)


def _document_flags(causal, docs):
    """Per-document causal flags from a bool or a sequence of bools /
    'causal' / 'full' / 'bidirectional'."""
    if isinstance(causal, (bool, int)) and not isinstance(causal, torch.Tensor):
        return [bool(causal)] * docs, bool(causal)
    if isinstance(causal, torch.Tensor):
        causal = causal.tolist()
    try:
        flags = list(causal)
    except TypeError:
        raise InvalidInputError(f"causal is {causal!r}; it must be a bool or one flag per "
                                "document") from None
    if len(flags) != docs:
        raise InvalidInputError(f"causal has {len(flags)} entries but cu_seqlens has {docs} "
                                "documents: give one flag per document")
    out = []
    for i, f in enumerate(flags):
        if isinstance(f, str):
            if f.lower() not in ("causal", "full", "bidirectional"):
                raise InvalidInputError(f"causal[{i}] is {f!r}; it must be a bool, 'causal', "
                                        "'full' or 'bidirectional'")
            out.append(f.lower() == "causal")
        else:
            out.append(bool(f))
    uniform = out[0] if out and all(f == out[0] for f in out) else None
    return out, uniform


def varlen(cu_seqlens_q, cu_seqlens_k=None, causal=False, window_size=(-1, -1)):
    """flash-attention's varlen mask: document b's queries [cu_q[b],
    cu_q[b+1]) see its keys [cu_k[b], cu_k[b+1]) with the bottom-right causal
    alignment and window (left, right). `causal` may be one flag per document
    (True/'causal', False/'full'/'bidirectional'). cu_seqlens_k defaults to
    cu_seqlens_q."""
    cu_q = cu_seqlens_values(cu_seqlens_q, "cu_seqlens_q" if cu_seqlens_k is not None
                             else "cu_seqlens")
    cu_k = cu_q if cu_seqlens_k is None else cu_seqlens_values(cu_seqlens_k, "cu_seqlens_k")
    if len(cu_k) != len(cu_q):
        raise InvalidInputError(f"cu_seqlens_q has {len(cu_q) - 1} documents but cu_seqlens_k "
                                f"has {len(cu_k) - 1}: they must describe the same documents")
    left, right = window_pair(window_size)
    flags, uniform = _document_flags(causal, len(cu_q) - 1)
    slices = []
    for b in range(len(cu_q) - 1):
        s = document_slice(cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1], flags[b], left, right)
        if s is not None:
            slices.append(s)
    documents = None
    if cu_q == cu_k and uniform is not None:
        if uniform and left >= -1:  # causal: right is 0 whatever was given
            documents = (cu_q, True, left)
        elif not uniform and (left, right) == (-1, -1):
            documents = (cu_q, False, -1)
    return Mask(slices, cu_q[-1], cu_k[-1], documents=documents)


def documents(cu_seqlens, causal=True, window_size=(-1, -1)):
    """Packed documents, each attending to itself only: causally, or
    bidirectionally, per document when `causal` is a list (e.g. text
    documents causal and image documents bidirectional in one pack);
    window_size as in flash-attention."""
    return varlen(cu_seqlens, None, causal, window_size)


def shared_prefix(groups, prefix_causal=True):
    """Packs where several answers share one prefix (a prompt, a question):
    `groups` is a list of (prefix_len, [answer_len, ...]); each group lies in
    the pack as prefix, answer 1, answer 2, ... Every answer sees the whole
    prefix and itself causally, never another answer; the prefix sees itself
    (causally, or bidirectionally when prefix_causal is False)."""
    slices, at = [], 0
    for g, group in enumerate(groups):
        try:
            prefix, answers = group
            prefix = _int(prefix, f"groups[{g}] prefix length")
            answers = [_int(a, f"groups[{g}] answer length") for a in answers]
        except (TypeError, ValueError):
            raise InvalidInputError(f"groups[{g}] is {group!r}; it must be (prefix_len, "
                                    "[answer_len, ...])") from None
        if prefix < 0 or any(a < 0 for a in answers):
            raise InvalidInputError(f"groups[{g}] has a negative length: {group!r}")
        p0, p1 = at, at + prefix
        if prefix > 0:
            slices.append(Slice(p0, p1, p0, p1, CAUSAL if prefix_causal else FULL, 0, -1))
        at = p1
        for a in answers:
            if a > 0:
                if prefix > 0:
                    slices.append(Slice(at, at + a, p0, p1, FULL, 0, -1))
                slices.append(Slice(at, at + a, at, at + a, CAUSAL, 0, -1))
            at += a
    return Mask(slices, at, at)


_MAGI_TYPES = {0: "full", 1: "causal", 2: "inv_causal", 3: "bi_causal",
               "full": "full", "causal": "causal", "inv_causal": "inv_causal",
               "invcausal": "inv_causal", "bi_causal": "bi_causal", "bicausal": "bi_causal"}


def _ranges(value, name):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        out = [(int(a), int(b)) for a, b in value]
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a [n, 2] tensor or a list of (start, end) "
                                "pairs") from None
    for i, (a, b) in enumerate(out):
        if a < 0 or b < a:
            raise InvalidInputError(f"{name}[{i}] is ({a}, {b}); it must satisfy 0 <= start <= end")
    return out


def magi(q_ranges, k_ranges, attn_type_map=None, total_seqlen_q=None, total_seqlen_k=None):
    """MagiAttention's mask vocabulary: slice i is q_ranges[i] x k_ranges[i]
    with attn_type_map[i] in 0 / 'full', 1 / 'causal' (bottom-right aligned),
    2 / 'inv_causal' (top-left aligned, keys at or after the row), 3 /
    'bi_causal' (both); default all full. Ranges are [n, 2] tensors or lists
    of (start, end). Totals default to the largest range end."""
    qr, kr = _ranges(q_ranges, "q_ranges"), _ranges(k_ranges, "k_ranges")
    if len(qr) != len(kr):
        raise InvalidInputError(f"q_ranges has {len(qr)} ranges but k_ranges has {len(kr)}")
    if attn_type_map is None:
        types = [0] * len(qr)
    else:
        types = attn_type_map.tolist() if isinstance(attn_type_map, torch.Tensor) else list(attn_type_map)
    if len(types) != len(qr):
        raise InvalidInputError(f"attn_type_map has {len(types)} entries but q_ranges has "
                                f"{len(qr)}")
    slices = []
    for i, ((q0, q1), (k0, k1), t) in enumerate(zip(qr, kr, types)):
        key = t.lower() if isinstance(t, str) else getattr(t, "value", t)
        kind = _MAGI_TYPES.get(key)
        if kind is None:
            raise InvalidInputError(f"attn_type_map[{i}] is {t!r}; it must be 0/'full', "
                                    "1/'causal', 2/'inv_causal' or 3/'bi_causal'")
        lq, lk = q1 - q0, k1 - k0
        s = lk - lq
        if kind == "full":
            slices.append(Slice(q0, q1, k0, k1, FULL, 0, -1))
        elif kind == "causal":
            slices.append(Slice(q0, q1, k0, k1, CAUSAL, s, -1))
        elif kind == "inv_causal":
            slices.append(Slice(q0, q1, k0, k1, CAUSAL, lk, lk))
        elif s >= 0:  # bi_causal; with fewer keys than queries it allows nothing
            slices.append(Slice(q0, q1, k0, k1, CAUSAL, s, s))
    nq = total_seqlen_q if total_seqlen_q is not None else max([b for _, b in qr], default=0)
    nk = total_seqlen_k if total_seqlen_k is not None else max([b for _, b in kr], default=0)
    return Mask(slices, nq, nk)


def from_slices(slices, num_q, num_k=None):
    """A Mask from explicit slices: Slice values or tuples (q_begin, q_end,
    k_begin, k_end[, 'full' | 'causal'[, offset[, window]]])."""
    return Mask(list(slices), num_q, num_k)

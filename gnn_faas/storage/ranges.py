"""The range planner, and a measured, batched range reader.

:func:`coalesce` plans the requests of a batch of byte ranges of one blob so
that the modelled cost ``requests·per_request_s + bytes·per_byte_s``
(:class:`~gnn_faas.storage.request_cost.RequestCost`, constants measured per
store) is minimal: overlapping and touching ranges are merged always, and two
neighbouring ranges are merged across their gap exactly when the gap's bytes
cost less than one request. :class:`RangeReader` turns a batch of ranges of
one blob into one ``read_ranges`` call (one round trip) and counts what it did.
A :class:`ByteBudget` spans several reads (every hop of a fetch and its feature
rows), so the bytes read beyond the needed ones go where they save the most
requests across the whole fetch, not a fixed share per read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import CorruptBlob
from gnn_faas.storage.backends import StorageBackend
from gnn_faas.storage.backends.file import gather_ranges
from gnn_faas.storage.request_cost import RequestCost, constants_for

# A read moves at most (1 + MAX_OVERREAD) x the bytes it needs: the requests
# saved by merging across gaps never cost more than the needed bytes again in
# transfer and in the reader's buffer.
MAX_OVERREAD = 1.0


@dataclass
class ReadStats:
    """What a reader did. ``bytes_needed`` is the union of the requested bytes
    (the exact minimum); ``bytes_read`` what was actually transferred."""

    bytes_read: int = 0
    bytes_needed: int = 0
    ranges_requested: int = 0
    round_trips: int = 0
    read_seconds: float = 0.0

    def add(self, other: ReadStats) -> None:
        self.bytes_read += other.bytes_read
        self.bytes_needed += other.bytes_needed
        self.ranges_requested += other.ranges_requested
        self.round_trips += other.round_trips
        self.read_seconds += other.read_seconds

    def as_dict(self) -> dict:
        return {
            "bytes_read": self.bytes_read,
            "bytes_needed": self.bytes_needed,
            "ranges_requested": self.ranges_requested,
            "round_trips": self.round_trips,
            "read_seconds": self.read_seconds,
        }


@dataclass
class ByteBudget:
    """Bytes that several reads together may move beyond the ones they need.

    Over all reads made through it the extra bytes stay within::

        extra <= max(fraction x (needed + promised), floor)

    ``needed`` counts the union bytes of the reads so far, ``promised`` bytes
    the caller will certainly need in later reads through this budget (a
    lower bound: the k-hop fetcher promises the feature rows of the vertices
    it has found, whose read comes last; :meth:`settle` drops the promise when
    that read is made). Since the promise never exceeds what is read later,
    the total moved stays within ``(1 + fraction)`` x the needed bytes of all
    the reads (or ``floor`` bytes more). Each read spends what is left smallest
    gap first (:func:`coalesce`), so a read with many small gaps (feature rows)
    uses the allowance an earlier read with few large gaps left over.
    """

    fraction: float = MAX_OVERREAD
    floor: float = 0.0
    needed: int = 0
    promised: int = 0
    extra: int = 0

    def allowance(self, needed_now: int) -> float:
        """Extra bytes a read needing ``needed_now`` bytes may move now."""
        total = self.fraction * (self.needed + needed_now + self.promised)
        return max(0.0, max(total, self.floor) - self.extra)

    def promise(self, nbytes: int) -> None:
        """Set the bytes the caller will need later (replaces the previous promise)."""
        self.promised = max(0, int(nbytes))

    def settle(self) -> None:
        """The promised read is being made: its bytes count as needed from now on."""
        self.promised = 0

    def spend(self, needed: int, extra: int) -> None:
        self.needed += int(needed)
        self.extra += int(extra)


@dataclass(frozen=True)
class CoalescedRanges:
    starts: np.ndarray  # merged ranges to request, sorted
    ends: np.ndarray
    offsets: np.ndarray  # where each input range begins in the concatenated merged bytes
    needed_bytes: int  # size of the union of the input ranges

    @property
    def read_bytes(self) -> int:
        return int((self.ends - self.starts).sum())


def coalesce(
    starts: np.ndarray,
    ends: np.ndarray,
    max_gap: float = 0.0,
    max_extra_bytes: float | Callable[[int], float] = np.inf,
) -> CoalescedRanges:
    """Merge ranges ``[starts[i], ends[i])`` into the cheapest set of requests.

    Overlapping or touching ranges are always merged; two neighbouring ranges
    whose gap is shorter than ``max_gap`` bytes are merged across it
    (``max_gap = per_request_s / per_byte_s``, :attr:`RequestCost.max_gap`).

    Why this rule is optimal for the cost ``C = R·c_r + B·c_b`` (``R``
    requests moving ``B`` bytes in all). Sort the ranges and merge the
    overlapping and touching ones: that leaves disjoint ranges ``1..n`` of
    ``U`` bytes in all, separated by gaps ``g_1..g_{n-1} > 0``. A plan is a
    set of byte intervals covering them. (i) In a cheapest plan every request
    covers whole ranges: a range cut between two requests means the two
    touch or overlap, and one request over both moves no more bytes for one
    request less. (ii) A request never starts or ends inside a gap (trimming
    it to the ranges it covers only removes bytes), and two requests never
    overlap (trimming one of them removes bytes). So a cheapest plan is a partition of ``1..n`` into runs of
    consecutive ranges, each run read as one request from its first start to
    its last end. Let ``M`` be the set of gaps that lie inside a run; then
    ``R = n − |M|`` and ``B = U + Σ_{i∈M} g_i``, hence::

        C(M) = n·c_r + U·c_b + Σ_{i∈M} (g_i·c_b − c_r)

    a sum of independent per-gap terms: ``C`` is minimal exactly when ``M``
    holds every gap with ``g_i·c_b < c_r``, i.e. ``g_i < c_r / c_b = max_gap``
    (a gap with equality may go either way; it is left open). The rule is one
    comparison on the array of gaps, computed on whole arrays below. With
    ``max_gap = 0`` (requests free) only the overlapping or touching ranges
    merge; with ``max_gap = inf`` (bytes free) the batch is one request.

    ``max_extra_bytes`` bounds ``Σ_{i∈M} g_i``, the bytes read beyond the
    union (a memory function holds them in its read buffer, so its peak
    memory must not follow the planner). Every merged gap saves exactly one
    request, so among the profitable gaps the plan that saves the most
    requests within the budget takes them smallest first: the longest prefix
    of the sorted profitable gaps whose sum fits (one sort and a cumulative
    sum). With an unbounded budget this is the rule above. A callable
    ``max_extra_bytes`` is given the union's bytes and returns the bound (a
    :class:`ByteBudget`'s allowance).
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    n = starts.size
    if n == 0:
        e = np.empty(0, dtype=np.int64)
        return CoalescedRanges(e, e, e, 0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)  # furthest byte covered by ranges up to i
    gaps = s[1:] - reach[:-1]  # <= 0: overlaps or touches the ranges before it
    # size of the union: each range contributes what lies beyond the reach before it
    before = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    needed = int(np.maximum(0, e - np.maximum(s, before)).sum())
    merge = (gaps <= 0) | (gaps < max_gap)
    if callable(max_extra_bytes):
        max_extra_bytes = max_extra_bytes(needed)
    if np.isfinite(max_extra_bytes):
        profitable = np.flatnonzero((gaps > 0) & (gaps < max_gap))
        by_size = profitable[np.argsort(gaps[profitable], kind="stable")]
        fits = np.cumsum(gaps[by_size]) <= max_extra_bytes
        merge[by_size[~fits]] = False
    new_group = np.concatenate(([True], ~merge))
    group = np.cumsum(new_group) - 1
    first = np.flatnonzero(new_group)
    last = np.concatenate((first[1:] - 1, [n - 1]))
    m_starts = s[first]
    m_ends = reach[last]
    m_len = m_ends - m_starts
    group_off = np.cumsum(m_len) - m_len
    off_sorted = group_off[group] + (s - m_starts[group])
    offsets = np.empty(n, dtype=np.int64)
    offsets[order] = off_sorted
    return CoalescedRanges(m_starts, m_ends, offsets, needed)


def plan_cost(plan: CoalescedRanges, cost: RequestCost) -> float:
    """Modelled seconds of reading ``plan`` as one batch."""
    return cost.cost(int(plan.starts.size), plan.read_bytes)


class RangeReader:
    """Batched, coalesced range reads of blobs in one backend, measured.

    Safe to share between threads: reads run concurrently (the backend retries
    its own calls), the cumulative :attr:`stats` are updated under a lock, and
    :meth:`recording` collects the reads of one thread's block (a request's
    own figures, whatever other threads read meanwhile)."""

    def __init__(
        self,
        backend: StorageBackend,
        cost: RequestCost | None = None,
        max_overread: float = MAX_OVERREAD,
    ):
        self.backend = backend
        self.cost = constants_for(backend) if cost is None else cost
        # bytes read beyond the needed ones, as a fraction of them (see coalesce)
        self.max_overread = max_overread
        self.stats = ReadStats()
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextmanager
    def recording(self) -> Iterator[ReadStats]:
        """The reads this thread makes through this reader inside the block."""
        sinks = getattr(self._local, "sinks", None)
        if sinks is None:
            sinks = self._local.sinks = []
        rec = ReadStats()
        sinks.append(rec)
        try:
            yield rec
        finally:
            sinks.remove(rec)

    def _count(self, one: ReadStats) -> None:
        with self._lock:
            self.stats.add(one)
        for sink in getattr(self._local, "sinks", ()):
            sink.add(one)

    def read(
        self, path: str, starts: np.ndarray, ends: np.ndarray, budget: ByteBudget | None = None
    ) -> np.ndarray:
        """Concatenation of ``[starts[i], ends[i])`` in the given order, as uint8.

        One backend call (one round trip) whatever the number of ranges; the
        requests are planned by :func:`coalesce` under this reader's measured
        :class:`RequestCost`, moving at most what ``budget`` allows beyond the
        needed bytes (without one: ``max_overread x`` this read's needed bytes).
        """
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        lengths = ends - starts
        if starts.size == 0 or not lengths.any():
            return np.empty(0, dtype=np.uint8)
        keep = lengths > 0
        if budget is None:
            budget = ByteBudget(self.max_overread)
        plan = coalesce(starts[keep], ends[keep], self.cost.max_gap, budget.allowance)
        budget.spend(plan.needed_bytes, plan.read_bytes - plan.needed_bytes)
        t0 = time.perf_counter()
        buf = self.backend.read_ranges(path, plan.starts, plan.ends)
        self._count(
            ReadStats(
                bytes_read=int(buf.size),
                bytes_needed=plan.needed_bytes,
                ranges_requested=int(plan.starts.size),
                round_trips=1,
                read_seconds=time.perf_counter() - t0,
            )
        )
        if buf.size != plan.read_bytes:
            raise CorruptBlob(f"{path}: short read ({buf.size} of {plan.read_bytes} bytes)")
        offsets = plan.offsets
        return gather_ranges(buf, offsets, offsets + lengths[keep])

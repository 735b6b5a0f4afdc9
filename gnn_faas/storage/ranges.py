"""Range coalescing and a measured, batched range reader.

:func:`coalesce` merges overlapping and touching byte ranges always, and
nearby ones while the extra bytes stay within a budget (smallest gaps first),
so a backend where each request costs a network call reads a little more in
far fewer requests. :class:`RangeReader` turns a batch of ranges of one blob
into one ``read_ranges`` call (one round trip) and counts what it did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import CorruptBlob
from gnn_faas.storage.backends import StorageBackend, with_retries
from gnn_faas.storage.backends.file import gather_ranges


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


@dataclass(frozen=True)
class CoalescedRanges:
    starts: np.ndarray  # merged ranges to request, sorted
    ends: np.ndarray
    offsets: np.ndarray  # where each input range begins in the concatenated merged bytes
    needed_bytes: int  # size of the union of the input ranges

    @property
    def read_bytes(self) -> int:
        return int((self.ends - self.starts).sum())


def coalesce(starts: np.ndarray, ends: np.ndarray, overhead: float = 0.0) -> CoalescedRanges:
    """Merge ranges ``[starts[i], ends[i])``.

    Overlapping or touching ranges are always merged. Gaps between the rest
    are merged smallest first while their total stays within
    ``overhead * needed_bytes``.
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
    merge = gaps <= 0
    if overhead > 0 and n > 1:
        pos = np.flatnonzero(gaps > 0)
        if pos.size:
            by_size = pos[np.argsort(gaps[pos], kind="stable")]
            within = np.cumsum(gaps[by_size]) <= overhead * needed
            merge[by_size[within]] = True
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


class RangeReader:
    """Batched, coalesced, retried range reads of blobs in one backend, measured."""

    def __init__(self, backend: StorageBackend, overhead: float | None = None):
        self.backend = backend
        self.overhead = backend.coalesce_overhead if overhead is None else overhead
        self.stats = ReadStats()

    def read(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Concatenation of ``[starts[i], ends[i])`` in the given order, as uint8.

        One backend call (one round trip) whatever the number of ranges.
        """
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        lengths = ends - starts
        if starts.size == 0 or not lengths.any():
            return np.empty(0, dtype=np.uint8)
        keep = lengths > 0
        plan = coalesce(starts[keep], ends[keep], self.overhead)
        t0 = time.perf_counter()
        buf = with_retries(lambda: self.backend.read_ranges(path, plan.starts, plan.ends))
        self.stats.read_seconds += time.perf_counter() - t0
        self.stats.round_trips += 1
        self.stats.ranges_requested += int(plan.starts.size)
        self.stats.bytes_read += int(buf.size)
        self.stats.bytes_needed += plan.needed_bytes
        if buf.size != plan.read_bytes:
            raise CorruptBlob(f"{path}: short read ({buf.size} of {plan.read_bytes} bytes)")
        offsets = plan.offsets
        return gather_ranges(buf, offsets, offsets + lengths[keep])

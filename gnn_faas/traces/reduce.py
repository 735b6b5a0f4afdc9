"""numpy's sums and percentiles of long arrays, in bounded memory and bit for bit.

A simulation of a week of requests produces per-request and per-invocation
values (latencies, durations) by the hundred million; its summary must be the
figures ``np.sum``, ``np.mean`` and ``np.percentile`` give on the whole arrays
(so a day simulated in chunks prints what it printed whole), without holding
those arrays. Values are appended to a :class:`Spill` (in memory up to a
limit, then in a file), and reduced from it:

- :func:`pairwise_sum` is ``np.add.reduce`` of a float64 array: numpy sums a
  contiguous array by pairwise summation over its whole length (``n <= 128``:
  eight running sums, combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) +
  (r6 + r7))``, then the rest one by one; longer: the halves at
  ``n2 = ⌊n/2⌋ − ⌊n/2⌋ mod 8``, each summed the same way, then added), so the
  tree depends only on ``n``: the replica recurses down the same splits to
  nodes of at most :data:`LEAF` values, which it reads and sums with numpy
  (``tests/traces/test_reduce.py`` checks the premise on numpy itself);
- :func:`percentiles` is ``np.percentile(x, q)`` (method ``linear``): the two
  order statistics around each virtual index ``(n − 1)·q/100`` are selected
  exactly (a radix select over the values' sortable 64-bit keys, 16 bits a pass,
  four passes over the spill), then interpolated as numpy's ``_lerp`` does
  (``a + (b − a)·γ``, or ``b − (b − a)·(1 − γ)`` for ``γ >= 0.5``).

Arrays that stay in memory are reduced by numpy directly.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator, Sequence

import numpy as np

LEAF = 1 << 20  # values read and summed by numpy at once
MEMORY_LIMIT = 1 << 21  # values a spill keeps in memory before it goes to its file
_SIGN = np.uint64(1 << 63)


class Spill:
    """float64 values appended in order: held in memory up to ``limit``
    values, then written to a file under ``directory`` (a temporary one by
    default, removed by :meth:`close`)."""

    def __init__(self, directory: str | None = None, limit: int | None = None):
        self.directory = directory
        self.limit = int(limit if limit is not None else MEMORY_LIMIT)
        self._parts: list[np.ndarray] = []
        self._held = 0
        self._file: str | None = None
        self._on_disk = 0

    def __len__(self) -> int:
        return self._on_disk + self._held

    @property
    def in_memory(self) -> bool:
        return self._file is None

    def append(self, values: np.ndarray) -> None:
        x = np.array(values, dtype=np.float64)  # a copy: the caller may reuse its array
        if x.size == 0:
            return
        self._parts.append(x.ravel())
        self._held += x.size
        if self._held > self.limit:
            self._flush()

    def _flush(self) -> None:
        if self._file is None:
            fd, self._file = tempfile.mkstemp(suffix=".f64", dir=self.directory)
            os.close(fd)
        with open(self._file, "ab") as f:
            for p in self._parts:
                f.write(p.tobytes())
        self._on_disk += self._held
        self._parts, self._held = [], 0

    def whole(self) -> np.ndarray:
        """Every value as one array (only while in memory)."""
        if self._file is not None:
            raise ValueError("this spill is on disk; read it in blocks")
        if len(self._parts) != 1:
            self._parts = [np.concatenate(self._parts) if self._parts else np.zeros(0)]
        return self._parts[0]

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Values ``[lo, hi)`` as a new contiguous array."""
        if self._file is None:
            return self.whole()[lo:hi].copy()
        if self._held:
            self._flush()
        with open(self._file, "rb") as f:
            return np.fromfile(f, np.float64, hi - lo, offset=8 * lo)

    def blocks(self, size: int | None = None) -> Iterator[np.ndarray]:
        n, size = len(self), size or LEAF
        for lo in range(0, n, size):
            yield self.read(lo, min(lo + size, n))

    def close(self) -> None:
        if self._file is not None:
            os.unlink(self._file)
        self._file, self._parts, self._held, self._on_disk = None, [], 0, 0


# (values, elementwise map applied to them); a sum runs over their concatenation
Segment = tuple[Spill, Callable[[np.ndarray], np.ndarray] | None]


def pairwise_sum(segments: Sequence[Segment]) -> float:
    """``np.add.reduce(np.concatenate([f(s) for s, f in segments]))`` (module
    docstring), reading at most :data:`LEAF` values at a time."""
    sizes = [len(s) for s, _ in segments]
    n = sum(sizes)
    if all(s.in_memory for s, _ in segments) and n <= LEAF:
        return float(np.add.reduce(_virtual(segments, sizes, 0, n)))
    return _node(segments, sizes, 0, n)


def _node(segments: Sequence[Segment], sizes: list[int], lo: int, n: int) -> float:
    if n <= LEAF:
        return float(np.add.reduce(_virtual(segments, sizes, lo, lo + n)))
    n2 = n // 2
    n2 -= n2 % 8
    return _node(segments, sizes, lo, n2) + _node(segments, sizes, lo + n2, n - n2)


def _virtual(segments: Sequence[Segment], sizes: list[int], lo: int, hi: int) -> np.ndarray:
    """Values ``[lo, hi)`` of the segments' mapped concatenation."""
    parts, base = [], 0
    for (spill, fn), size in zip(segments, sizes, strict=True):
        a, b = max(lo, base), min(hi, base + size)
        if a < b:
            x = spill.read(a - base, b - base)
            parts.append(fn(x) if fn is not None else x)
        base += size
    if len(parts) == 1:
        return np.ascontiguousarray(parts[0], dtype=np.float64)
    return np.concatenate(parts) if parts else np.zeros(0)


def mean(spill: Spill) -> float:
    """``x.mean()`` (0.0 when empty, as the summaries report)."""
    n = len(spill)
    return pairwise_sum([(spill, None)]) / n if n else 0.0


def percentiles(spill: Spill, q: Sequence[float] | float) -> np.ndarray | np.float64:
    """``np.percentile(x, q)`` for the spill's values ``x`` (no NaN)."""
    if spill.in_memory:
        return np.percentile(spill.whole(), q)
    n = len(spill)
    quantiles = np.true_divide(np.asanyarray(q), 100)
    virtual = np.asanyarray((n - 1) * quantiles)
    prev = np.floor(virtual)
    nxt = prev + 1
    last = virtual >= n - 1
    prev, nxt = np.where(last, n - 1, prev), np.where(last, n - 1, nxt)
    prev, nxt = np.where(virtual < 0, 0, prev), np.where(virtual < 0, 0, nxt)
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    ranks = sorted(set(prev.ravel().tolist()) | set(nxt.ravel().tolist()))
    value = dict(zip(ranks, select(spill, ranks), strict=True))
    a = np.vectorize(value.__getitem__, otypes=[np.float64])(prev)
    b = np.vectorize(value.__getitem__, otypes=[np.float64])(nxt)
    gamma = np.asanyarray(virtual - np.floor(virtual), dtype=virtual.dtype)
    diff = b - a
    out = np.asanyarray(np.add(a, diff * gamma))
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5, casting="unsafe")
    return out[()] if out.ndim == 0 else out


def _keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys that sort as the float64 values do (negatives reversed)."""
    bits = x.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _value(key: int) -> float:
    k = np.uint64(key)
    bits = k ^ _SIGN if k & _SIGN else ~k
    return float(np.asarray(bits, dtype=np.uint64).view(np.float64))


def select(spill: Spill, ranks: Sequence[int]) -> list[float]:
    """The values at 0-based positions ``ranks`` of the sorted spill: a radix
    select, 16 bits of key a pass (four passes over the spill)."""
    prefix = [0] * len(ranks)
    left = [int(r) for r in ranks]
    for shift in (48, 32, 16, 0):
        wanted = sorted(set(prefix))
        counts = {p: np.zeros(1 << 16, np.int64) for p in wanted}
        for block in spill.blocks():
            k = _keys(block)
            for p in wanted:
                kk = k if shift == 48 else k[(k >> np.uint64(shift + 16)) == np.uint64(p)]
                digits = ((kk >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64)
                counts[p] += np.bincount(digits, minlength=1 << 16)
        for j, p in enumerate(prefix):
            cum = np.cumsum(counts[p])
            d = int(np.searchsorted(cum, left[j], side="right"))
            left[j] -= int(cum[d - 1]) if d else 0
            prefix[j] = (p << 16) | d
    return [_value(p) for p in prefix]

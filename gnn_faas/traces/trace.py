"""What every trace loader returns, and the helpers they share.

A :class:`Trace` is a sorted array of arrival times in seconds (from 0) with,
per arrival, the index of the trace function it belongs to. Loaders read the
original files (gzip or plain), and a malformed or truncated file raises
:class:`TraceFormatError` naming the file and the line.

Spreading per-bin counts inside their bin (Azure 2019 per minute, Twitter per
second), for a bin ``[t, t + w)`` holding ``c`` arrivals:

- ``exponential`` (default, as vHive In-Vitro does): ``c`` exponential gaps
  ``g_1..g_c`` plus one closing gap ``g_{c+1}``, rescaled so they fill the bin:
  arrival ``j`` at ``t + w·(g_1 + ... + g_j) / (g_1 + ... + g_{c+1})``;
- ``uniform``: ``c`` independent uniform times in the bin;
- ``equidistant``: ``t + w·(j − 0.5)/c`` for ``j = 1..c``.

Every arrival stays inside its bin and the counts per bin are kept exactly.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound

SPREADS = ("exponential", "uniform", "equidistant")


class TraceFormatError(InvalidRequest):
    """A trace file is malformed or truncated (the message names file and line)."""

    def __init__(self, path: str | Path, line: int | None, what: str):
        where = f"{path}, line {line}" if line is not None else str(path)
        super().__init__(f"{where}: {what}")
        self.path, self.line = str(path), line


@dataclass(frozen=True)
class Trace:
    """Arrivals (seconds, sorted) of one or more trace functions.

    ``function[i]`` indexes ``functions`` (names); ``duration_s`` is the span
    the trace covers (arrivals lie in ``[0, duration_s)``). The first
    ``warmup_s`` seconds (``meta``, 0 unless a window was cut with a warm-up)
    are played but not measured."""

    name: str
    arrivals: np.ndarray
    function: np.ndarray
    functions: tuple[str, ...]
    duration_s: float
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arrivals.size and np.any(np.diff(self.arrivals) < 0):
            raise ValueError("arrivals must be sorted")

    @property
    def requests(self) -> int:
        return int(self.arrivals.size)

    @property
    def warmup_s(self) -> float:
        return float(self.meta.get("warmup_s", 0.0))

    @property
    def measured_s(self) -> float:
        """The span the figures are for: the duration after the warm-up."""
        return self.duration_s - self.warmup_s

    @property
    def measured_requests(self) -> int:
        return int(self.arrivals.size - np.searchsorted(self.arrivals, self.warmup_s))

    def window(self, start_s: float, duration_s: float, warmup_s: float = 0.0) -> Trace:
        """The arrivals in ``[start_s, start_s + duration_s)``, shifted to start at 0;
        the first ``warmup_s`` of it are the warm-up."""
        lo, hi = np.searchsorted(self.arrivals, [start_s, start_s + duration_s])
        return Trace(
            self.name,
            self.arrivals[lo:hi] - start_s,
            self.function[lo:hi],
            self.functions,
            float(min(duration_s, max(self.duration_s - start_s, 0.0))),
            {**self.meta, "window_start_s": float(start_s), "warmup_s": float(warmup_s)},
        )

    def per_second(self) -> np.ndarray:
        """Arrivals per second over ``ceil(duration_s)`` seconds."""
        n = max(int(np.ceil(self.duration_s)), 1)
        return np.bincount(self.arrivals.astype(np.int64).clip(0, n - 1), minlength=n)


def open_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` of a text file, gzip or not; a truncated gzip
    stream raises :class:`TraceFormatError` at the line it stopped in."""
    p = Path(path)
    if not p.is_file():
        raise NotFound(f"trace file not found: {p} (pass --trace-file)")
    with open(p, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gz else open
    n = 0
    try:
        with (
            opener(p, "rb") as stream,
            io.TextIOWrapper(stream, encoding="utf-8", newline="") as text,
        ):
            for n, line in enumerate(text, start=1):  # noqa: B007 - n names the failing line
                yield n, line.rstrip("\r\n")
    except (EOFError, gzip.BadGzipFile, OSError) as exc:
        raise TraceFormatError(p, n + 1, f"truncated or corrupt file ({exc})") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(p, n + 1, f"not UTF-8 text ({exc.reason})") from None


def spread(
    counts: np.ndarray,
    bin_s: float,
    method: str = "exponential",
    rng: np.random.Generator | None = None,
    first_bin: int = 0,
) -> np.ndarray:
    """Arrival times (sorted) for ``counts[k]`` arrivals in bin ``[k·bin_s, (k+1)·bin_s)``
    (see the module docstring for the three methods). ``first_bin``: the
    counts are bins ``first_bin, first_bin + 1, ...`` of a longer trace; with
    ``uniform`` and ``rng`` advanced past the earlier bins' draws the times are
    those the whole trace gives these bins, bit for bit (each arrival takes
    one draw, and the sort never moves one across a bin)."""
    if method not in SPREADS:
        raise InvalidRequest(f"unknown spread {method!r}; choose from {list(SPREADS)}")
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size and counts.min() < 0:
        raise InvalidRequest("counts must be >= 0")
    rng = rng if rng is not None else np.random.default_rng(0)
    n = int(counts.sum())
    bins = np.repeat(np.arange(first_bin, first_bin + counts.size), counts)
    # position of each arrival inside its bin (0-based) and its bin's count
    starts = np.cumsum(counts) - counts
    j = np.arange(n) - np.repeat(starts, counts)
    c = np.repeat(counts, counts)
    if method == "equidistant":
        frac = (j + 0.5) / c
    elif method == "uniform":
        frac = np.sort(rng.random(n) + bins) - bins  # sorted inside each bin
    else:
        gaps = rng.exponential(1.0, n + counts.size)
        # each bin owns c gaps for its arrivals plus one closing gap
        owner = np.repeat(np.arange(counts.size), counts + 1)
        totals = np.bincount(owner, weights=gaps, minlength=counts.size)
        keep = np.ones(gaps.size, bool)
        keep[np.cumsum(counts + 1) - 1] = False  # drop each bin's closing gap
        cum = np.cumsum(gaps)
        first = np.cumsum(counts + 1) - (counts + 1)
        base = np.repeat(cum[first] - gaps[first], counts)
        frac = (cum[keep] - base) / np.repeat(totals, counts)
    frac = np.clip(frac, 0.0, np.nextafter(1.0, 0.0))
    return (bins + frac) * bin_s


def compress(arrivals: np.ndarray, factor: float) -> np.ndarray:
    """Time compression keeping the shape: ``t / factor`` (``factor`` > 1 plays faster)."""
    if factor <= 0:
        raise InvalidRequest("the time-compression factor must be positive")
    return np.asarray(arrivals, dtype=np.float64) / factor

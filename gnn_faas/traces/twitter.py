"""Arrival times from the real Twitter trace (BATCH / λGrapher).

``twitter_may25_per_second.npz`` holds requests per second over one day
(``count`` int32 [86400]). :func:`arrivals` takes the window of ``duration_s``
seconds whose mean rate is highest, rescales its per-second counts so the
mean rate is ``rps`` (keeping the trace's burstiness), and spreads each
second's arrivals uniformly with a seeded generator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.paths import shared_datasets_dir

TRACE_FILE = "twitter_may25_per_second.npz"


def load_per_second(path: str | Path | None = None) -> np.ndarray:
    p = Path(path) if path else shared_datasets_dir() / TRACE_FILE
    if not p.is_file():
        raise NotFound(f"Twitter trace not found at {p} (pass --trace-file)")
    with np.load(p, allow_pickle=False) as z:
        if "count" not in z:
            raise InvalidRequest(f"{p}: no 'count' array")
        return z["count"].astype(np.int64)


def busiest_window(counts: np.ndarray, duration_s: int) -> int:
    """Start second of the ``duration_s`` window with the most requests."""
    if duration_s >= counts.size:
        return 0
    window = np.convolve(counts, np.ones(duration_s, dtype=np.int64), mode="valid")
    return int(np.argmax(window))


def arrivals(
    rps: float, duration_s: float, seed: int = 0, counts: np.ndarray | None = None
) -> np.ndarray:
    """Sorted arrival times in seconds from 0, at a mean of ``rps`` per second."""
    if rps <= 0 or duration_s <= 0:
        raise InvalidRequest("rps and duration must be positive")
    counts = load_per_second() if counts is None else np.asarray(counts, dtype=np.int64)
    seconds = int(np.ceil(duration_s))
    start = busiest_window(counts, seconds)
    window = counts[start : start + seconds].astype(np.float64)
    if window.sum() == 0:
        window = np.ones(seconds)
    rng = np.random.default_rng(seed)
    scaled = window * (rps * seconds / window.sum())
    # integer counts preserving the total: floor plus a seeded rounding of the remainders
    per_second = np.floor(scaled).astype(np.int64)
    per_second += rng.random(seconds) < (scaled - per_second)
    sec = np.repeat(np.arange(seconds), per_second)
    times = sec + rng.random(sec.size)
    times = times[times < duration_s]
    return np.sort(times)

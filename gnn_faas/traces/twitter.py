"""Arrival times from the real Twitter trace (BATCH / λGrapher).

``twitter_may25_per_second.npz`` holds requests per second over one day
(``count`` int32 [86400]); :func:`load_day` spreads each second's count inside
its second (:func:`gnn_faas.traces.trace.spread`). ``TW_may25_0-1.gz`` is the
raw first hour, one inter-arrival time (seconds) per line; :func:`load_raw_hour`
turns it into arrivals by a cumulative sum. :func:`arrivals` takes the window
of ``duration_s`` seconds whose mean rate is highest, rescales its per-second
counts so the mean rate is ``rps`` (keeping the trace's burstiness), and spreads
each second's arrivals uniformly with a seeded generator.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.paths import shared_datasets_dir
from gnn_faas.traces.trace import Trace, TraceFormatError, compress, open_lines, spread

TRACE_FILE = "twitter_may25_per_second.npz"
RAW_HOUR_FILE = "TW_may25_0-1.gz"


def load_per_second(path: str | Path | None = None) -> np.ndarray:
    p = Path(path) if path else shared_datasets_dir() / TRACE_FILE
    if not p.is_file():
        raise NotFound(f"Twitter trace not found at {p} (pass --trace-file)")
    if p.suffix == ".gz" or not zipfile.is_zipfile(p):
        raise TraceFormatError(
            p,
            None,
            f"not the per-second .npz ({TRACE_FILE}); a raw hour of inter-arrival times "
            f"(such as {RAW_HOUR_FILE}) is read with --raw-hour",
        )
    try:
        with np.load(p, allow_pickle=False) as z:
            if "count" not in z:
                raise TraceFormatError(p, None, "no 'count' array")
            counts = z["count"].astype(np.int64)
    except (ValueError, OSError, EOFError) as exc:
        raise TraceFormatError(p, None, f"not a readable .npz file ({exc})") from None
    if counts.ndim != 1 or (counts.size and counts.min() < 0):
        raise TraceFormatError(p, None, "'count' must be a 1-D array of counts >= 0")
    return counts


def load_day(
    path: str | Path | None = None,
    *,
    spread_method: str = "uniform",
    seed: int = 0,
    speedup: float = 1.0,
) -> Trace:
    """The whole day (4,395,692 arrivals in the shared file), each second's
    count spread inside its second."""
    counts = load_per_second(path)
    t = spread(counts, 1.0, spread_method, np.random.default_rng(seed))
    return _trace(t, counts.size, path, spread_method, seed, speedup)


def load_window(
    start_s: float,
    duration_s: float,
    path: str | Path | None = None,
    *,
    warmup_s: float = 0.0,
    spread_method: str = "uniform",
    seed: int = 0,
    speedup: float = 1.0,
) -> Trace:
    """``load_day(...).window(start_s, duration_s, warmup_s)``, equal to it,
    spreading only the seconds around the window: the generator skips the
    draws of the seconds before them (``bit_generator.advance``, one draw per
    arrival under ``uniform``; ``equidistant`` draws none). ``exponential``
    draws a varying number per arrival, so it spreads the whole day."""
    if spread_method == "exponential" or speedup <= 0:
        day = load_day(path, spread_method=spread_method, seed=seed, speedup=speedup)
        return day.window(start_s, duration_s, warmup_s)
    counts = load_per_second(path)
    # the seconds whose arrivals can fall in the window, one spare at each end
    lo = min(max(int(np.floor(start_s * speedup)) - 1, 0), counts.size)
    hi = min(max(int(np.ceil((start_s + duration_s) * speedup)) + 1, lo), counts.size)
    rng = np.random.default_rng(seed)
    if spread_method == "uniform":
        rng.bit_generator.advance(int(counts[:lo].sum()))
    t = spread(counts[lo:hi], 1.0, spread_method, rng, first_bin=lo)
    part = _trace(t, counts.size, path, spread_method, seed, speedup)
    return part.window(start_s, duration_s, warmup_s)


def _trace(t, seconds: int, path, spread_method: str, seed: int, speedup: float) -> Trace:
    """The day's trace of arrival times ``t`` (seconds of the uncompressed day)."""
    return Trace(
        name="twitter",
        arrivals=compress(t, speedup),
        function=np.zeros(t.size, np.int32),
        functions=("twitter",),
        duration_s=seconds / speedup,
        meta={"file": str(path or shared_datasets_dir() / TRACE_FILE), "seed": seed,
              "spread": spread_method, "speedup": speedup},
    )  # fmt: skip


def load_raw_hour(path: str | Path | None = None, *, speedup: float = 1.0) -> Trace:
    """The raw hour: arrival ``i`` at the sum of the first ``i`` inter-arrival times."""
    p = Path(path) if path else shared_datasets_dir() / RAW_HOUR_FILE
    gaps = []
    for n, line in open_lines(p):
        if not line.strip():
            continue
        try:
            g = float(line)
        except ValueError:
            raise TraceFormatError(p, n, f"not an inter-arrival time: {line[:40]!r}") from None
        if not g >= 0 or g == float("inf"):
            raise TraceFormatError(p, n, "inter-arrival times must be finite and >= 0")
        gaps.append(g)
    if not gaps:
        raise TraceFormatError(p, None, "no inter-arrival times")
    t = np.cumsum(gaps) - gaps[0]
    return Trace(
        name="twitter-raw",
        arrivals=compress(t, speedup),
        function=np.zeros(t.size, np.int32),
        functions=("twitter",),
        duration_s=float(max(np.ceil(t[-1]), 1.0)) / speedup,
        meta={"file": str(p), "speedup": speedup},
    )


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

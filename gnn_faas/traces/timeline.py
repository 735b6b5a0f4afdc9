"""Per-second timelines from intervals, and the run summary they feed.

For intervals ``[s_i, e_i)`` with weights ``w_i`` the covered weight inside
second ``k`` is ``C(k+1) − C(k)`` where ``C(t) = Σ_i w_i·clip(t − s_i, 0, e_i − s_i)``;
``C`` at all integer ``t`` comes from sorted starts and ends with cumulative
sums (no loop over intervals), so ``Σ_k timeline[k]`` equals ``Σ_i w_i·(e_i − s_i)``
exactly (up to float rounding) whenever the timeline spans every interval.
"""

from __future__ import annotations

import numpy as np


def _integral(points: np.ndarray, weights: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``Σ_i w_i·max(t − p_i, 0)`` for every ``t``."""
    order = np.argsort(points, kind="stable")
    p, w = points[order], weights[order]
    cw = np.concatenate([[0.0], np.cumsum(w)])
    cwp = np.concatenate([[0.0], np.cumsum(w * p)])
    k = np.searchsorted(p, t, side="right")
    return t * cw[k] - cwp[k]


def coverage(
    starts: np.ndarray, ends: np.ndarray, weights: np.ndarray | float, seconds: int
) -> np.ndarray:
    """Weight·seconds of the intervals inside each second ``[k, k+1)``, ``k < seconds``."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.maximum(np.asarray(ends, dtype=np.float64), s)
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), s.shape)
    t = np.arange(seconds + 1, dtype=np.float64)
    c = _integral(s, w, t) - _integral(e, w, t)
    return np.diff(c)


def counts_per_second(times: np.ndarray, seconds: int) -> np.ndarray:
    k = np.clip(np.floor(np.asarray(times)).astype(np.int64), 0, max(seconds - 1, 0))
    return np.bincount(k, minlength=seconds)[:seconds]


def in_flight(arrivals: np.ndarray, done: np.ndarray, seconds: int) -> np.ndarray:
    """Requests in flight at the start of each second."""
    t = np.arange(seconds, dtype=np.float64)
    return np.searchsorted(np.sort(arrivals), t, side="right") - np.searchsorted(
        np.sort(done), t, side="right"
    )


class Timeline:
    """The per-second timeline of a run fed in chunks (bounded memory: one
    value per second per column): arrivals and completions per second,
    requests in flight at the start of each second, and the busy GB of the
    invocations inside each second; the instances' columns come from their
    lifetimes at the end (:meth:`columns`).

    An invocation ``[s, e)`` of weight ``w`` adds ``w·(e − s)`` to its second
    when it starts and ends in one, else ``w·(⌊s⌋ + 1 − s)`` to its first,
    ``w·(e − ⌊e⌋)`` to its last and ``w`` to each second between (a
    difference array): exact per interval, where :func:`coverage`'s
    cumulative sums lose digits over a day."""

    def __init__(self) -> None:
        self.arrivals = np.zeros(0, np.int64)
        self.completions = np.zeros(0, np.int64)
        self.arrived_by = np.zeros(0, np.int64)  # values v with ⌈v⌉ = k: count of v <= k
        self.done_by = np.zeros(0, np.int64)
        self.busy = np.zeros(0)
        self.busy_full = np.zeros(0)  # difference array of whole busy seconds
        self.end = 0.0  # latest time seen

    @staticmethod
    def _add(acc: np.ndarray, index: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        if index.size == 0:
            return acc
        n = int(index.max()) + 1
        if n > acc.size:
            acc = np.concatenate([acc, np.zeros(max(n, 2 * acc.size) - acc.size, acc.dtype)])
        add = np.bincount(index, weights=weights, minlength=acc.size)
        acc += add.astype(acc.dtype, copy=False)
        return acc

    def requests(self, arrivals: np.ndarray, done: np.ndarray) -> None:
        """A chunk of requests: arrival times and completion times (inf: dropped)."""
        ok = np.isfinite(done)
        d = done[ok]
        for t in (arrivals, d):
            if t.size:
                self.end = max(self.end, float(t.max()))
        self.arrivals = self._add(self.arrivals, np.floor(arrivals).astype(np.int64))
        self.completions = self._add(self.completions, np.floor(d).astype(np.int64))
        self.arrived_by = self._add(self.arrived_by, np.ceil(arrivals).astype(np.int64))
        self.done_by = self._add(self.done_by, np.ceil(d).astype(np.int64))

    def invocations(self, start: np.ndarray, end: np.ndarray, gb: float) -> None:
        """A chunk of invocations ``[start, end)`` on functions of ``gb`` GB."""
        if start.size == 0:
            return
        self.end = max(self.end, float(end.max()))
        e = np.maximum(end, start)
        fs, fe = np.floor(start), np.floor(e)
        one = fs == fe
        i_s, i_e = fs.astype(np.int64), fe.astype(np.int64)
        self.busy = self._add(self.busy, i_s[one], gb * (e[one] - start[one]))
        m = ~one
        self.busy = self._add(self.busy, i_s[m], gb * (fs[m] + 1.0 - start[m]))
        self.busy = self._add(self.busy, i_e[m], gb * (e[m] - fe[m]))
        full = m & (i_e > i_s + 1)
        self.busy_full = self._add(self.busy_full, i_s[full] + 1, np.full(full.sum(), gb))
        self.busy_full = self._add(self.busy_full, i_e[full], np.full(full.sum(), -gb))

    def columns(self, spawn: np.ndarray, stop: np.ndarray, mb: np.ndarray,
                seconds: int | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """The timeline over ``seconds`` (default: up to the last event), with
        the instances' lives (``spawn``, ``stop``, memory ``mb``)."""
        end = max(self.end, float(stop.max(initial=0.0)))
        n = seconds or max(int(np.ceil(end)), 1)

        def fit(a: np.ndarray, fold: bool) -> np.ndarray:
            out = np.zeros(n, a.dtype)
            k = min(a.size, n)
            out[:k] = a[:k]
            if fold and a.size > n:  # times at the horizon count in its last second
                out[n - 1] += a[n:].sum()
            return out

        busy = fit(self.busy, False) + np.cumsum(fit(self.busy_full, False))
        return {
            "second": np.arange(n),
            "arrivals": fit(self.arrivals, True),
            "completions": fit(self.completions, True),
            "in_flight": np.cumsum(fit(self.arrived_by, False))
            - np.cumsum(fit(self.done_by, False)),
            "instances": coverage(spawn, stop, 1.0, n),
            "allocated_gb": coverage(spawn, stop, mb / 1024.0, n),
            "busy_gb": busy,
        }

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

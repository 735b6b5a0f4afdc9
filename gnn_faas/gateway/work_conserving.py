"""Work-conserving graph sharing: when a buffer may hold its requests.

Sharing comes from the backlog that exists anyway, as a dynamic batcher's does,
not from holding requests up to the SLO. The gate counts ``F``, executions
dispatched and not finished, against a concurrency target ``C`` (``1 <= C <=
C_max``, the pool's most instances); ``free = ⌊C⌋ − F``. Per model, ``objective``:
``cost`` (the gate is off: the decision-tree timeouts decide), ``latency`` (``C =
C_max``, no wait for company) or ``balanced`` (default: least GB-s subject to p99 <=
SLO, mean latency <= (1 + s)·L₁ and p99 <= (1 + s)·P₁, ``s`` = ``latency_slack``,
``L₁``/``P₁`` the mean and p99 of one-request executions without the pools' queue
waits).

A buffer in a gated pool closes at once when ``free > 0`` (unless ``λ·W >= 1``
arrivals are expected within ``W = s·L₁/2``: then at ``opened + W``); while ``free
<= 0`` it holds every arriving request and closes the moment an execution
finishes, so the backlog runs as one batch. After every execution ``C`` moves by
``GAIN`` times the excess of the measured mean (EWMA) and p99 (last ``WINDOW``
requests) over their bounds, clipped to ``[1, C_max]``.

The SLO cap and ``Tmax`` of :mod:`gnn_faas.gateway.buffer` and
``max_requests_per_buffer`` still bound every buffer. The live gateway and
``gnn-faas simulate`` run this class through
:class:`~gnn_faas.gateway.buffer_pool.BufferPoolState`. The derivation of the
bounds and of ``C``'s rule: docs/design/work-conserving-gate.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gnn_faas.choices import OBJECTIVES

EWMA_WEIGHT = 0.02  # per request (an execution of k requests weighs 1 − (1 − w)^k)
GAIN = 0.05  # change of C per execution at a mean latency one L₁ off the bound
WINDOW = 2000  # requests behind q, one-request executions behind P₁
QUANTILE_EVERY = 50  # executions between two recomputations of q and P₁
_TABLE = 256  # an execution's EWMA weight for k < _TABLE requests, computed once
_WEIGHTS = [1.0 - (1.0 - EWMA_WEIGHT) ** k for k in range(_TABLE)]


@dataclass(frozen=True)
class Objective:
    """A model's buffer objective (see the module docstring)."""

    name: str = "balanced"
    latency_slack: float = 0.1

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ValueError(f"buffers.objective must be one of {OBJECTIVES}, not {self.name!r}")
        if not (self.latency_slack >= 0 and math.isfinite(self.latency_slack)):
            raise ValueError("buffers.latency_slack must be a finite number >= 0")

    @property
    def slack(self) -> float:
        """``s``: 0 for ``latency`` whatever was configured."""
        return 0.0 if self.name == "latency" else self.latency_slack


class WorkConservingGate:
    """The rule of the module docstring as plain state driven by explicit
    events (not thread-safe: the buffer pool's lock guards it)."""

    def __init__(self, objective: Objective, exec_estimate_s: float):
        self.objective = objective
        self.max_concurrency: int | None = None  # C_max; unknown: the gate is off
        self.concurrency = 1.0  # C
        self.in_flight = 0  # F
        self.fit = _LineFit(float(exec_estimate_s))  # d = α + β·k
        self.latency_s = float(exec_estimate_s)  # m
        self.executions = 0
        self.recent = _Window(WINDOW)  # per execution: its requests' mean latency
        self.singles = _Window(WINDOW)  # durations of one-request executions
        self.p99_s = 0.0  # q
        self.single_p99_s = math.inf  # P₁ (unknown: no p99 term)

    @property
    def active(self) -> bool:
        return self.max_concurrency is not None and self.objective.name != "cost"

    def set_max_concurrency(self, n: int) -> None:
        self.max_concurrency = max(int(n), 1)
        if self.objective.name == "latency":
            self.concurrency = float(self.max_concurrency)
        self.concurrency = min(self.concurrency, float(self.max_concurrency))

    @property
    def free(self) -> int:
        return int(self.concurrency) - self.in_flight

    @property
    def single_s(self) -> float:
        """``L₁``: the fitted execution time of one request."""
        return self.fit.at(1.0)

    @property
    def bound_s(self) -> float:
        """``(1 + s)·L₁``: the balanced objective's mean-latency bound."""
        return (1.0 + self.objective.slack) * self.single_s

    def company_wait_s(self, arrival_rate: float) -> float:
        """``W`` when company is worth waiting for (``λ·W >= 1``), else 0."""
        w = 0.5 * self.objective.slack * self.single_s
        return w if arrival_rate * w >= 1.0 else 0.0

    def close_at(self, opened_at: float, arrival_rate: float) -> float:
        """When a buffer opened at ``opened_at`` closes under the gate: rule 1
        while an execution may start, else never by itself (rule 2: an
        execution's end releases it; the buffer's SLO cap and Tmax still hold)."""
        if self.free > 0:
            return opened_at + self.company_wait_s(arrival_rate)
        return math.inf

    def dispatched(self) -> None:
        self.in_flight += 1

    def dispatch_alone(self, arrival_rate: float) -> bool:
        """The gate is on, an execution may start (``free > 0``) and no company
        is worth waiting for (:meth:`company_wait_s` is 0): counted as
        dispatched, True; otherwise nothing changes, False. (One call for
        what the simulator asks at most arrivals.)"""
        if self.max_concurrency is None or int(self.concurrency) - self.in_flight <= 0:
            return False
        objective = self.objective
        if objective.name == "cost":
            return False
        fit = self.fit
        single = fit._at_one if fit._at_one is not None else fit.at(1.0)
        slack = 0.0 if objective.name == "latency" else objective.latency_slack
        w = 0.5 * slack * single
        if arrival_rate * w >= 1.0 and w > 0:  # company_wait_s(rate) > 0
            return False
        self.in_flight += 1
        return True

    def finished(
        self, duration_s: float, requests: int, mean_wait_s: float, queued_s: float = 0.0
    ) -> None:
        """An execution of ``requests`` requests took ``duration_s`` (dispatch to
        answer), ``queued_s`` of it in the function pools' queues; its requests
        had waited ``mean_wait_s`` in their buffer."""
        # (runs once per execution in the simulator's day-long replays: plain
        # Python on locals, comparisons where builtin min/max would be called,
        # each written as min/max decides (the first argument on a tie or NaN):
        # the same operations in the same order, tests/gateway/test_buffer_pool_golden.py)
        f = self.in_flight - 1
        self.in_flight = f if f > 0 else 0  # max(0, F - 1)
        self.executions += 1
        k = int(requests)
        if k < 1:  # max(k, 1)
            k = 1
        weight = _WEIGHTS[k] if k < _TABLE else 1.0 - (1.0 - EWMA_WEIGHT) ** k
        service = float(duration_s) - float(queued_s)
        if service < 0.0:
            service = 0.0
        single = self.fit.add_at_one(float(k), service, weight)  # L₁ after this execution
        latency = mean_wait_s + duration_s
        self.latency_s += weight * (latency - self.latency_s)
        recent = self.recent
        if k == 1:
            recent.values[recent.n % recent.size] = latency
            recent.n += 1
            singles = self.singles
            singles.values[singles.n % singles.size] = service
            singles.n += 1
        else:
            recent.add(latency, recent.size if recent.size < k else k)  # min(k, size)
        if self.executions % QUANTILE_EVERY == 0:
            self.p99_s = recent.p99()
            self.single_p99_s = self.singles.p99() if self.singles.full else math.inf
        if self.max_concurrency is not None and self.objective.name == "balanced":
            bound = 1.0 + self.objective.latency_slack  # (1 + s): balanced's slack
            over_mean = self.latency_s - bound * single
            over_p99 = self.p99_s - bound * self.single_p99_s
            error = (over_p99 if over_p99 > over_mean else over_mean) / (
                1e-6 if single < 1e-6 else single
            )
            c = self.concurrency + GAIN * error
            if c < 1.0:  # min(max(c, 1), C_max)
                c = 1.0
            cap = float(self.max_concurrency)
            self.concurrency = cap if cap < c else c

    def as_dict(self) -> dict:
        return {
            "objective": self.objective.name,
            "latency_slack": self.objective.slack,
            "max_concurrency": self.max_concurrency,
            "concurrency": self.concurrency,
            "in_flight": self.in_flight,
            "single_execution_ms": self.single_s * 1e3,
            "mean_latency_ms": self.latency_s * 1e3,
            "bound_ms": self.bound_s * 1e3,
            "p99_latency_ms": self.p99_s * 1e3,
            "p99_bound_ms": (
                (1.0 + self.objective.slack) * self.single_p99_s * 1e3
                if math.isfinite(self.single_p99_s)
                else None
            ),
        }


class _Window:
    """The last ``size`` values, in a ring (numpy), and their 99th percentile."""

    def __init__(self, size: int):
        self.values = np.zeros(size)
        self.size = int(size)
        self.n = 0

    @property
    def full(self) -> bool:
        return self.n >= self.values.size

    def add(self, x: float, times: int = 1) -> None:
        values, size = self.values, self.values.size
        for _ in range(times):
            values[self.n % size] = x
            self.n += 1

    def p99(self) -> float:
        k = min(self.n, self.values.size)
        return percentile99(self.values[:k]) if k else 0.0


def percentile99(x: np.ndarray) -> float:
    """``np.percentile(x, 99)`` (method ``linear``, ``x`` without NaN), without
    its generality: the two order statistics around ``(n − 1)·0.99`` by one
    partition at the lower (the upper is the least value above it: a fifth of a
    2,000-value window's second selection's cost), interpolated as numpy's
    ``_lerp`` does (``a + (b − a)·γ``, or ``b − (b − a)·(1 − γ)`` for ``γ >=
    0.5``). The gate asks every ``QUANTILE_EVERY`` executions, where numpy's own
    call costs more than the partition."""
    n = x.size
    virtual = (n - 1) * np.true_divide(99, 100)
    lo = int(np.floor(virtual))
    if virtual >= n - 1:
        return float(np.partition(x, n - 1)[n - 1])
    part = np.partition(x, lo)
    a, b = part[lo], part[lo + 1 :].min()
    gamma = virtual - np.floor(virtual)
    diff = b - a
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


class _LineFit:
    """``y = α + β·x`` by exponentially weighted least squares (running
    moments); the prior is one point ``(1, y0)``, so until ``x`` varies the
    line is flat at the mean ``y``."""

    def __init__(self, y0: float):
        self.sx, self.sy, self.sxx, self.sxy = 1.0, y0, 1.0, y0
        self._at_one: float | None = None  # at(1.0) until the next add (the gate asks often)

    def add(self, x: float, y: float, weight: float) -> None:
        self._at_one = None
        keep = 1.0 - weight
        self.sx = keep * self.sx + weight * x
        self.sy = keep * self.sy + weight * y
        self.sxx = keep * self.sxx + weight * x * x
        self.sxy = keep * self.sxy + weight * x * y

    def add_at_one(self, x: float, y: float, weight: float) -> float:
        """:meth:`add`, then :meth:`at` ``(1.0)`` (cached as ``at`` caches it)."""
        keep = 1.0 - weight
        self.sx = sx = keep * self.sx + weight * x
        self.sy = sy = keep * self.sy + weight * y
        self.sxx = sxx = keep * self.sxx + weight * x * x
        self.sxy = sxy = keep * self.sxy + weight * x * y
        # _at(1.0) on the locals, max(v, 0.0) as a comparison
        var = sxx - sx * sx
        beta = (sxy - sx * sy) / var if var > 1e-9 else 0.0
        if beta < 0.0:
            beta = 0.0
        one = sy + beta * (1.0 - sx)
        if one < 0.0:
            one = 0.0
        self._at_one = one
        return one

    def at(self, x: float) -> float:
        if x == 1.0:
            if self._at_one is None:
                self._at_one = self._at(1.0)
            return self._at_one
        return self._at(x)

    def _at(self, x: float) -> float:
        var = self.sxx - self.sx * self.sx
        beta = (self.sxy - self.sx * self.sy) / var if var > 1e-9 else 0.0
        beta = max(beta, 0.0)  # an execution never gets cheaper with more work
        return max(self.sy + beta * (x - self.sx), 0.0)

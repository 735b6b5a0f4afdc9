"""One graph-sharing buffer and its state vector (λGrapher 3.2-3.3).

A buffer collects requests whose k-hop vertex sets overlap, so the scheduler
aggregates each shared vertex once. It opens with its first request at
``opened_at`` and closes at

    close_at = min(deadline, opened_at + Tmax, min_r (deadline_r − exec_estimate))

``deadline`` starts at ``opened_at + T0`` and the timeout configurator moves it
at every decision point (every τ while open); ``Tmax`` bounds how long a buffer
ever waits; the last term keeps every request inside its SLO once execution
(estimated) follows the close.

State vector ``(R, S, N, Q, K)`` that the configurator sees, in this order:

- ``R``: remaining slack of the most urgent request, ``(min_r deadline_r − now) / SLO``
  (1 for a request that just arrived, 0 at its SLO, negative past it);
- ``S``: the buffer's union-based sharing degree ``1 − K / Σ_r |U_r|`` (the
  fraction of vertex work that merging saves; 0 for one request);
- ``N``: requests in the buffer;
- ``Q``: recent arrival rate at the gateway (requests/s), an exponentially
  decayed event count (time constant 1 s by default), see :class:`ArrivalRate`;
- ``K``: ``|U_b|``, the vertices of the union of the requests' k-hop sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnn_faas.gateway.sharing import union_sharing_degree

_exp = math.exp  # (one lookup: the simulator observes every arrival)
FEATURES = ("R", "S", "N", "Q", "K")
REASONS = (
    "timeout",
    "decision",
    "fast_path",
    "full",
    "deadline",
    "shutdown",
    "idle",
    "held",
    "capacity",
)


@dataclass(frozen=True)
class PendingRequest:
    """A request waiting in a buffer. ``vertex_set``: its sorted, unique k-hop
    vertex set ``U_r``; ``deadline``: ``arrival + SLO`` (when its answer is due)."""

    id: str
    vertex_set: np.ndarray
    arrival: float
    deadline: float
    payload: Any = None


@dataclass(frozen=True)
class ClosedBuffer:
    """What the scheduler receives when a buffer closes.

    ``sharing_degree = 1 − union_size / total_vertices`` (union-based, as the
    buffer state's ``S``); ``reason`` is why it closed: ``"timeout"`` (its
    deadline or Tmax passed), ``"decision"`` (the configurator chose −1),
    ``"fast_path"`` (a lone request with no arrival expected, see
    :class:`~gnn_faas.gateway.timeout_configurator.FastPath`), ``"full"``
    (request or vertex capacity), ``"deadline"`` (a request's SLO
    budget ran out first), ``"shutdown"`` (flushed); under the work-conserving
    gate (:mod:`gnn_faas.gateway.work_conserving`) ``"idle"`` (an instance was
    free), ``"capacity"`` (one freed while it held) and ``"held"`` (it held
    for capacity as long as the gate allows).
    """

    buffer_id: int
    requests: tuple[PendingRequest, ...]
    sharing_degree: float
    union_size: int
    total_vertices: int
    opened_at: float
    closed_at: float
    reason: str
    decisions: tuple[int, ...] = ()

    @property
    def num_requests(self) -> int:
        return len(self.requests)


class ArrivalRate:
    """Exponentially decayed arrival count: ``value ← value·e^(−Δt/T) + 1/T`` at
    each arrival, read as ``value·e^(−Δt/T)``; a Poisson stream of rate λ reads
    λ on average. Deterministic given the arrival times (fake clocks replay it)."""

    def __init__(self, time_constant_s: float = 1.0):
        if time_constant_s <= 0:
            raise ValueError("time_constant_s must be positive")
        self.time_constant_s = float(time_constant_s)
        self._value = 0.0
        self._last: float | None = None

    def observe(self, t: float, value: float | None = None) -> None:
        """An arrival at ``t``; ``value``: :meth:`observed` ``(t)`` when already known."""
        self._value = self.observed(t) if value is None else value
        self._last = t

    def observed(self, t: float) -> float:
        """The value an arrival at ``t`` leaves (what :meth:`rate` reads at ``t`` after it)."""
        last = self._last
        tc = self.time_constant_s
        if last is None:
            return 0.0 + 1.0 / tc
        d = t - last
        # max(0.0, d) as a comparison (max returns its first argument unless d > 0)
        return self._value * _exp(-(d if d > 0.0 else 0.0) / tc) + 1.0 / tc

    def rate(self, now: float) -> float:
        if self._last is None:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._last) / self.time_constant_s)


@dataclass
class Buffer:
    """An open buffer (mutable; the pool guards it with its lock).

    ``slot`` is its column in the pool's :class:`~gnn_faas.gateway.sharing.SharingIndex`;
    ``union_size`` mirrors that index (``K``); ``cap`` is
    ``min_r (deadline_r − exec_estimate)``.
    """

    buffer_id: int
    slot: int
    opened_at: float
    deadline: float
    tmax_at: float
    next_decision_at: float
    requests: list[PendingRequest] = field(default_factory=list)
    total_vertices: int = 0
    union_size: int = 0
    cap: float = math.inf
    decisions: list[int] = field(default_factory=list)
    gated: bool = False  # timed by the work-conserving gate, not the tree

    # -- membership ------------------------------------------------------------
    def add(self, request: PendingRequest, exec_estimate_s: float) -> None:
        self.requests.append(request)
        self.total_vertices += int(request.vertex_set.size)
        self.cap = min(self.cap, request.deadline - exec_estimate_s)

    def remove(self, request_id: str, exec_estimate_s: float) -> PendingRequest:
        for i, r in enumerate(self.requests):
            if r.id == request_id:
                del self.requests[i]
                break
        else:
            raise KeyError(request_id)
        self.total_vertices -= int(r.vertex_set.size)
        self.cap = min((q.deadline - exec_estimate_s for q in self.requests), default=math.inf)
        return r

    # -- timing ------------------------------------------------------------------
    @property
    def close_at(self) -> float:
        return min(self.deadline, self.tmax_at, self.cap)

    def close_reason(self) -> str:
        """Why the buffer closes at :attr:`close_at` (``"deadline"`` when a
        request's SLO budget, not the timeout, is the binding bound)."""
        return "deadline" if self.cap < min(self.deadline, self.tmax_at) else "timeout"

    @property
    def earliest_deadline(self) -> float:
        return min((r.deadline for r in self.requests), default=math.inf)

    # -- figures -------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def sharing_degree(self) -> float:
        return union_sharing_degree(self.union_size, self.total_vertices)

    def state(self, now: float, arrival_rate: float, slo_s: float) -> np.ndarray:
        """The ``(R, S, N, Q, K)`` vector (float64 ``[5]``) described above."""
        return np.array(
            [
                (self.earliest_deadline - now) / slo_s,
                self.sharing_degree,
                float(self.num_requests),
                float(arrival_rate),
                float(self.union_size),
            ]
        )

    def mean_delay(self, closed_at: float) -> float:
        """Mean wait of the buffer's requests if it closes at ``closed_at`` (seconds)."""
        if not self.requests:
            return 0.0
        return closed_at - float(np.mean([r.arrival for r in self.requests]))

    def closed(self, closed_at: float, reason: str) -> ClosedBuffer:
        return ClosedBuffer(
            buffer_id=self.buffer_id,
            requests=tuple(self.requests),
            sharing_degree=self.sharing_degree,
            union_size=int(self.union_size),
            total_vertices=int(self.total_vertices),
            opened_at=self.opened_at,
            closed_at=closed_at,
            reason=reason,
            decisions=tuple(self.decisions),
        )

    def copy(self) -> Buffer:
        """A copy that shares the (immutable) requests but not the lists."""
        b = Buffer(**{k: getattr(self, k) for k in self.__dataclass_fields__})
        b.requests = list(self.requests)
        b.decisions = list(self.decisions)
        return b

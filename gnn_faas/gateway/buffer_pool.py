"""Multi-buffers: routing, timeouts, global moves and closing, thread-safe.

:class:`BufferPoolState` is the pool's logic as a plain object driven by
explicit times (``submit(request, now)``, ``advance(now, decide)``), so a
discrete-event replay runs and forks it; :class:`MultiBufferPool` wraps it with
a lock, a :class:`~gnn_faas.clock.Clock`, a timeout configurator, an optional
:class:`~gnn_faas.gateway.timeout_history.TimeoutHistory` and an
``on_close`` callback (called outside the lock), plus a background thread that
sleeps until the next event (a decision point or a close).

Life of a buffer (see :mod:`gnn_faas.gateway.buffer` for ``close_at``):

1. a request routed to a free slot opens it: ``deadline = now + T0``, first
   decision point at ``now + τ``, ``tmax_at = now + Tmax``;
2. at each decision point (every τ, while neither Tmax nor a request's SLO
   budget has run out) the configurator's decision is applied; then, if any
   decision was taken and ``global_opt`` is on, the global optimiser's moves;
3. the buffer closes when ``now >= close_at`` (``"timeout"`` or
   ``"deadline"``), on decision −1 (``"decision"``), when it reaches
   ``max_requests_per_buffer`` or ``max_vertices_per_buffer`` (``"full"``), or on
   :meth:`MultiBufferPool.flush` (``"shutdown"``). Every submitted request is
   delivered in exactly one :class:`ClosedBuffer`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnn_faas.clock import Clock
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer import (
    ArrivalRate,
    Buffer,
    ClosedBuffer,
    PendingRequest,
)
from gnn_faas.gateway.global_optimizer import Move, optimise
from gnn_faas.gateway.router import Router
from gnn_faas.gateway.sharing import SharingIndex, as_vertex_set, union_sharing_degree
from gnn_faas.gateway.timeout_configurator import (
    DECISION_CLOSE,
    FastPath,
    TimeoutConfigurator,
    TimeoutParams,
)
from gnn_faas.gateway.work_conserving import Objective, WorkConservingGate

__all__ = [
    "BufferConfig",
    "BufferPoolState",
    "ClosedBuffer",
    "MultiBufferPool",
    "PendingRequest",
]

log = logging.getLogger(__name__)

# decide(buffer, state, now) -> decision code
DecideFn = Callable[[Buffer, np.ndarray, float], int]


@dataclass(frozen=True)
class BufferConfig:
    """Multi-buffer settings (defaults for an SLO of 0.3 s; why: docs/design/timeouts.md).

    ``tau_s``: decision interval (None: ``0.1·slo_s``). ``exec_estimate_s``: the
    time a closed buffer needs to execute; a buffer closes early enough that
    ``close + exec_estimate_s <= arrival + SLO`` for each of its requests.
    ``open_below``: a request opens a new buffer (if a slot is free) when its
    best sharing degree is at most this (0: only when it shares nothing).
    ``rate_time_constant_s``: time constant of the arrival-rate feature ``Q``.
    ``max_moves``: bound on global moves per decision round.
    ``fast_path_arrivals``: a lone request's buffer closes at once when fewer
    arrivals than this are expected within Tmax (``FastPath``; 0: off).
    ``objective``, ``latency_slack``: the work-conserving gate
    (:mod:`gnn_faas.gateway.work_conserving`), in force once the pool is told
    its capacity (:meth:`BufferPoolState.set_capacity`); ``cost`` keeps the
    tree's timeouts alone.
    """

    num_buffers: int = 4
    slo_s: float = 0.3
    gamma: float = 0.1
    delta: float = 0.5
    tau_s: float | None = None
    max_steps: int = 3
    alpha: float = 1.0
    beta: float = 0.5
    max_requests_per_buffer: int = 64
    max_vertices_per_buffer: int | None = None
    exec_estimate_s: float = 0.05
    global_opt: bool = True
    open_below: float = 0.0
    rate_time_constant_s: float = 1.0
    max_moves: int = 16
    fast_path_arrivals: float = 1.0
    objective: str = "balanced"
    latency_slack: float = 0.1

    def __post_init__(self) -> None:
        Objective(self.objective, self.latency_slack)  # raises on a bad pair
        if self.num_buffers < 1:
            raise ValueError("num_buffers must be >= 1")
        if self.slo_s <= 0:
            raise ValueError("slo_s must be positive")
        if not 0 < self.gamma <= self.delta:
            raise ValueError("need 0 < gamma <= delta")
        if self.tau_s is not None and self.tau_s <= 0:
            raise ValueError("tau_s must be positive")
        if self.max_steps < 0 or self.max_requests_per_buffer < 1:
            raise ValueError("max_steps must be >= 0 and max_requests_per_buffer >= 1")
        if self.max_requests_per_buffer >= 2**31:
            raise ValueError("max_requests_per_buffer is too large")
        if self.exec_estimate_s < 0:
            raise ValueError("exec_estimate_s must be >= 0")

    @property
    def tau(self) -> float:
        return self.tau_s if self.tau_s is not None else 0.1 * self.slo_s

    @property
    def t0(self) -> float:
        return self.gamma * self.slo_s

    @property
    def tmax(self) -> float:
        return self.delta * self.slo_s

    @property
    def params(self) -> TimeoutParams:
        return TimeoutParams(
            gamma=self.gamma,
            delta=self.delta,
            tau=self.tau / self.slo_s,
            max_steps=self.max_steps,
            alpha=self.alpha,
            beta=self.beta,
        )

    @classmethod
    def from_settings(cls, settings: Any, slo_s: float, model: Any = None) -> BufferConfig:
        """The config of a model with this SLO from the serving config's ``buffers``
        section (:class:`~gnn_faas.config.BufferSettings`): every field the two
        share is copied by name, and ``tau_s = tau_fraction·slo_s`` (τ is set
        relative to the SLO, so one section serves every model). ``model``: the
        model's own ``buffers`` (:class:`~gnn_faas.config.ModelBufferSettings`),
        whose fields that are set override the section's."""
        mine = {f.name for f in dataclasses.fields(cls)}
        shared = {
            f.name: getattr(settings, f.name)
            for f in dataclasses.fields(settings)
            if f.name in mine
        }
        if model is not None:
            for f in dataclasses.fields(model):
                if f.name in mine and getattr(model, f.name) is not None:
                    shared[f.name] = getattr(model, f.name)
        return cls(slo_s=slo_s, tau_s=settings.tau_fraction * slo_s, **shared)

    @classmethod
    def from_params(cls, params: TimeoutParams, slo_s: float = 0.3, **kw: Any) -> BufferConfig:
        """A config using a fitted tree's parameters (``tau`` is relative to the SLO)."""
        return cls(
            slo_s=slo_s,
            gamma=params.gamma,
            delta=params.delta,
            tau_s=params.tau * slo_s,
            max_steps=params.max_steps,
            alpha=params.alpha,
            beta=params.beta,
            **kw,
        )


def closed_gain(closed: ClosedBuffer, alpha: float, beta: float, slo_s: float) -> float:
    """``μ = α·S − β·D`` of a closed buffer: ``S`` its sharing degree, ``D`` the
    mean wait of its requests over the SLO."""
    if not closed.requests:
        return 0.0
    wait = closed.closed_at - float(np.mean([r.arrival for r in closed.requests]))
    return alpha * closed.sharing_degree - beta * wait / slo_s


class BufferPoolState:
    """The pool's logic and state, driven by explicit times (not thread-safe)."""

    def __init__(self, config: BufferConfig, num_nodes: int):
        self.config = config
        self.num_nodes = int(num_nodes)
        self.index = SharingIndex(num_nodes, config.num_buffers, config.max_requests_per_buffer)
        self.router = Router(
            self.index,
            config.max_requests_per_buffer,
            config.max_vertices_per_buffer,
            config.open_below,
        )
        self.slots: list[Buffer | None] = [None] * config.num_buffers
        self.rate = ArrivalRate(config.rate_time_constant_s)
        self.location: dict[str, int] = {}  # request id -> slot
        self.next_buffer_id = 0
        self.submitted = 0
        self.closed_buffers = 0
        self.closed_requests = 0
        self.sharing_sum = 0.0
        self.union_sum = 0
        self.total_sum = 0
        self.moves = 0
        self.emptied_by_moves = 0
        self.reasons: Counter[str] = Counter()
        self.decision_counts: Counter[int] = Counter()
        self.fast_path = FastPath(config.fast_path_arrivals)
        objective = Objective(config.objective, config.latency_slack)
        self.gate = WorkConservingGate(objective, config.exec_estimate_s)

    # -- queries -------------------------------------------------------------------
    def open_buffers(self) -> list[Buffer]:
        return [b for b in self.slots if b is not None]

    def next_event_time(self) -> float:
        """Earliest pending decision point or close (``inf`` when all slots are free)."""
        t = math.inf
        for b in self.slots:
            if b is not None:
                t = min(t, b.close_at, b.next_decision_at)
        return t

    def pending(self) -> int:
        return len(self.location)

    # -- events ----------------------------------------------------------------------
    def submit(self, request: PendingRequest, now: float) -> tuple[int, float, list[ClosedBuffer]]:
        """Route and add a request; returns ``(buffer_id, S at routing, closed)``."""
        if request.id in self.location:
            raise InvalidRequest(f"request id {request.id!r} is already waiting in a buffer")
        u = request.vertex_set
        if u.size == 0:
            raise InvalidRequest("a request needs a non-empty vertex set")
        self.rate.observe(now)
        self.submitted += 1
        if self._dispatch_alone(now):
            return self._close_alone(request, now)
        closed: list[ClosedBuffer] = []
        slot, s = self.router.route(u, self.slots)
        if slot < 0:
            # No free slot and no open buffer can take it: close the one due first.
            victim = min(self.open_buffers(), key=lambda b: (b.close_at, b.buffer_id))
            closed.append(self._close(victim.slot, now, "full"))
            slot, s = victim.slot, 0.0
        b = self.slots[slot]
        if b is None:
            c = self.config
            b = Buffer(
                buffer_id=self.next_buffer_id,
                slot=slot,
                opened_at=now,
                deadline=now + c.t0,
                tmax_at=now + c.tmax,
                next_decision_at=now + c.tau,
            )
            self.next_buffer_id += 1
            self.slots[slot] = b
            if self.gate.active:  # the gate, not the tree, decides when it closes
                b.gated = True
                b.next_decision_at = math.inf
        b.add(request, self.config.exec_estimate_s)
        self.index.add(slot, u)
        b.union_size = int(self.index.sizes[slot])
        self.location[request.id] = slot
        if b.gated:
            b.deadline = self.gate.close_at(b.opened_at, self.rate.rate(now))
        if b.gated and self._is_full(b):
            closed.append(self._close(slot, now, "full"))
        elif b.gated and b.close_at <= now:
            closed.append(self._close(slot, now, self._gated_reason(b)))
        elif self._fast(b, now):
            b.decisions.append(DECISION_CLOSE)
            self.decision_counts[DECISION_CLOSE] += 1
            closed.append(self._close(slot, now, "fast_path"))
        elif self._is_full(b):
            closed.append(self._close(slot, now, "full"))
        elif b.close_at <= now:
            closed.append(self._close(slot, now, b.close_reason()))
        return b.buffer_id, s, closed

    def submit_alone(self, size: int, now: float) -> bool:
        """:meth:`submit` of a request of ``size`` vertices when the gate
        dispatches it alone (no buffer open, an execution free, no company worth
        waiting for): counted exactly as :meth:`submit` counts it (its closed
        buffer of one, reason ``"idle"``), without building the request or its
        closed buffer, and True; otherwise nothing changes and False (call
        :meth:`submit`). The simulator's arrivals take this path first."""
        if self.location or size <= 0 or self.config.max_requests_per_buffer < 1:
            return False
        # the rate submit's rule reads once it observed this arrival
        # (rate(now) right after observe(now) is the observed value times exp(-0) = 1)
        value = self.rate.observed(now)
        if not self.gate.dispatch_alone(value):  # (counts the dispatch when True)
            return False
        self.rate.observe(now, value)
        self.submitted += 1
        self.next_buffer_id += 1
        self.closed_buffers += 1
        self.closed_requests += 1
        self.union_sum += size
        self.total_sum += size
        self.reasons["idle"] += 1
        return True

    def advance(self, now: float, decide: DecideFn) -> list[ClosedBuffer]:
        """Run the decision points due by ``now`` (in time order), the global
        optimisation, then close every buffer that is due or full."""
        closed: list[ClosedBuffer] = []
        due = sorted(
            (b for b in self.slots if b is not None and b.next_decision_at <= now),
            key=lambda b: (b.next_decision_at, b.buffer_id),
        )
        decided = False
        for b in due:
            if self.slots[b.slot] is not b:
                continue
            b.next_decision_at += self.config.tau
            if b.next_decision_at <= now:  # a late tick: resume the cadence from now
                b.next_decision_at = now + self.config.tau
            if min(b.tmax_at, b.cap) <= now:
                continue  # it must close now whatever the configurator says
            if self._fast(b, now):  # ahead of the tree: no sharing can come
                b.decisions.append(DECISION_CLOSE)
                self.decision_counts[DECISION_CLOSE] += 1
                closed.append(self._close(b.slot, now, "fast_path"))
                continue
            state = b.state(now, self.rate.rate(now), self.config.slo_s)
            d = decide(b, state, now)
            decided = True
            c = self.apply_decision(b.slot, d, now)
            if c is not None:
                closed.append(c)
        if decided and self.config.global_opt:
            self.apply_moves(self.plan_moves())
        for slot, b in enumerate(self.slots):
            if b is None:
                continue
            if self._is_full(b):
                closed.append(self._close(slot, now, "full"))
            elif b.close_at <= now:
                reason = self._gated_reason(b) if b.gated else b.close_reason()
                closed.append(self._close(slot, now, reason))
        return closed

    # -- the work-conserving gate ---------------------------------------------------
    def set_capacity(self, capacity: int, now: float) -> list[ClosedBuffer]:
        """``capacity``: most executions at once (the function pool's most
        instances). The first call turns the gate on (unless the objective is
        ``cost``); a buffer held for capacity closes when some is free."""
        self.gate.set_max_concurrency(capacity)
        # while gated, a request joins an open buffer rather than opening one
        self.router.open_below = -1.0 if self.gate.active else self.config.open_below
        return self._release(now)

    def finished(
        self, now: float, duration_s: float, requests: int, mean_wait_s: float,
        queued_s: float = 0.0,
    ) -> list[ClosedBuffer]:  # fmt: skip
        """An execution dispatched by a close finished (its instance is free)."""
        self.gate.finished(duration_s, requests, mean_wait_s, queued_s)
        return self._release(now)

    def _release(self, now: float) -> list[ClosedBuffer]:
        """Re-time the gated buffers; close, oldest first, those that may run now."""
        if not self.gate.active or not self.location:  # no buffer open
            return []
        gated = [b for b in self.slots if b is not None and b.gated]
        if not gated:
            return []
        closed: list[ClosedBuffer] = []
        rate = self.rate.rate(now)
        for b in sorted(gated, key=lambda b: (b.opened_at, b.buffer_id)):
            free = self.gate.free > 0
            b.deadline = self.gate.close_at(b.opened_at, rate)
            if b.close_at <= now:
                closed.append(self._close(b.slot, now, "capacity" if free else "held"))
        return closed

    def _dispatch_alone(self, now: float) -> bool:
        """Under the gate with no buffer open, an execution free to start and no
        company worth waiting for, a request closes its buffer as it opens it."""
        g = self.gate
        return (
            g.active
            and g.free > 0
            and not self.location
            and g.company_wait_s(self.rate.rate(now)) <= 0
            and self.config.max_requests_per_buffer >= 1
        )

    def _close_alone(self, request: PendingRequest, now: float) -> tuple[int, float, list]:
        """:meth:`submit`'s result for a request dispatched alone (reason
        ``"idle"``): the closed buffer of one request (``K = Σ|U_r| = |U_r|``,
        sharing degree 0), without the sharing index or an open buffer."""
        size = int(request.vertex_set.size)
        buffer_id = self.next_buffer_id
        self.next_buffer_id += 1
        self.gate.dispatched()
        self.closed_buffers += 1
        self.closed_requests += 1
        self.union_sum += size
        self.total_sum += size
        self.reasons["idle"] += 1
        closed = ClosedBuffer(buffer_id, (request,), union_sharing_degree(size, size), size, size,
                              now, now, "idle")  # fmt: skip
        return buffer_id, 0.0, [closed]

    def _gated_reason(self, b: Buffer) -> str:
        if b.cap < min(b.deadline, b.tmax_at):
            return "deadline"
        return "idle" if self.gate.free > 0 else "held"

    def apply_decision(self, slot: int, decision: int, now: float) -> ClosedBuffer | None:
        """Apply a decision code to the buffer in ``slot`` (closing it on −1)."""
        b = self.slots[slot]
        if b is None:
            raise ValueError(f"slot {slot} holds no buffer")
        d = int(min(max(decision, DECISION_CLOSE), self.config.max_steps))
        b.decisions.append(d)
        self.decision_counts[d] += 1
        if d == DECISION_CLOSE:
            return self._close(slot, now, "decision")
        if d > 0:
            b.deadline = min(b.deadline + d * self.config.tau, b.tmax_at)
        return None

    def plan_moves(self) -> list[Move]:
        c = self.config
        return optimise(
            self.slots,
            self.index,
            alpha=c.alpha,
            beta=c.beta,
            slo_s=c.slo_s,
            exec_estimate_s=c.exec_estimate_s,
            max_requests=c.max_requests_per_buffer,
            max_vertices=c.max_vertices_per_buffer,
            max_moves=c.max_moves,
        )

    def apply_moves(self, moves: list[Move]) -> None:
        for m in moves:
            src, dst = self.slots[m.source], self.slots[m.target]
            if src is None or dst is None:
                raise ValueError(f"move {m} refers to a free slot")
            r = src.remove(m.request_id, self.config.exec_estimate_s)
            self.index.remove(m.source, r.vertex_set)
            src.union_size = int(self.index.sizes[m.source])
            dst.add(r, self.config.exec_estimate_s)
            self.index.add(m.target, r.vertex_set)
            dst.union_size = int(self.index.sizes[m.target])
            self.location[r.id] = m.target
            self.moves += 1
            if not src.requests:
                # Its requests all went elsewhere: the buffer disappears unclosed.
                self.index.clear(m.source)
                self.slots[m.source] = None
                self.emptied_by_moves += 1

    def flush(self, now: float, reason: str = "shutdown") -> list[ClosedBuffer]:
        return [self._close(b.slot, now, reason) for b in self.open_buffers()]

    # -- internals ---------------------------------------------------------------------
    def _fast(self, b: Buffer, now: float) -> bool:
        if b.gated or self.fast_path.min_expected_arrivals <= 0:
            return False
        state = b.state(now, self.rate.rate(now), self.config.slo_s)
        return self.fast_path.closes(state, self.config.tmax)

    def _is_full(self, b: Buffer) -> bool:
        c = self.config
        if b.num_requests >= c.max_requests_per_buffer:
            return True
        return c.max_vertices_per_buffer is not None and b.union_size >= c.max_vertices_per_buffer

    def _close(self, slot: int, now: float, reason: str) -> ClosedBuffer:
        b = self.slots[slot]
        assert b is not None
        if self.gate.max_concurrency is not None:
            self.gate.dispatched()
        closed = b.closed(now, reason)
        self.index.clear(slot)
        self.slots[slot] = None
        for r in b.requests:
            del self.location[r.id]
        self.closed_buffers += 1
        self.closed_requests += b.num_requests
        self.sharing_sum += closed.sharing_degree
        self.union_sum += closed.union_size
        self.total_sum += closed.total_vertices
        self.reasons[reason] += 1
        return closed

    def copy(self) -> BufferPoolState:
        """An independent copy (for counterfactual replays); requests are shared."""
        other = copy.copy(self)
        other.index = self.index.copy()
        other.router = Router(
            other.index,
            self.config.max_requests_per_buffer,
            self.config.max_vertices_per_buffer,
            self.config.open_below,
        )
        other.slots = [b.copy() if b is not None else None for b in self.slots]
        other.rate = copy.copy(self.rate)
        other.location = dict(self.location)
        other.reasons = Counter(self.reasons)
        other.decision_counts = Counter(self.decision_counts)
        other.gate = copy.copy(self.gate)
        return other

    def stats(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "waiting": self.pending(),
            "open_buffers": len(self.open_buffers()),
            "closed_buffers": self.closed_buffers,
            "closed_requests": self.closed_requests,
            "mean_sharing_degree": self.sharing_sum / self.closed_buffers
            if self.closed_buffers
            else 0.0,
            "overall_sharing_degree": 1.0 - self.union_sum / self.total_sum
            if self.total_sum
            else 0.0,
            "moves": self.moves,
            "buffers_emptied_by_moves": self.emptied_by_moves,
            "close_reasons": dict(self.reasons),
            "decisions": {str(k): v for k, v in sorted(self.decision_counts.items())},
            "gate": self.gate.as_dict(),
        }


class MultiBufferPool:
    """Thread-safe multi-buffer pool (the gateway's entry point to batching).

    ``configurator.decide(state)`` sets timeouts; ``on_close(closed_buffer)`` is
    called outside the lock, from the thread that closed the buffer (the
    submitting thread for ``"full"``, the ticker otherwise). ``history``, when
    given, records every decision and, at close, its buffer's gain μ.
    ``max_concurrency``, when given, is the most executions that may run at
    once (the function pool's most instances): it turns the work-conserving
    gate on, and the caller reports each closed buffer's execution with
    :meth:`finished`.
    """

    def __init__(
        self,
        config: BufferConfig,
        num_nodes: int,
        clock: Clock,
        configurator: TimeoutConfigurator,
        on_close: Callable[[ClosedBuffer], None],
        history: Any | None = None,  # TimeoutHistory (kept loose to avoid an import cycle)
        max_wait_s: float = 0.05,
        max_concurrency: int | None = None,
    ):
        self.config = config
        self.num_nodes = int(num_nodes)
        self.clock = clock
        self.configurator = configurator
        self.on_close = on_close
        self.history = history
        self.max_wait_s = float(max_wait_s)
        self._state = BufferPoolState(config, num_nodes)
        if max_concurrency is not None:
            self._state.set_capacity(max_concurrency, clock.now())
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False
        # when the sleeping ticker wakes by itself (None: it is not asleep)
        self._ticker_wakes_at: float | None = None
        self.callback_errors = 0

    # -- requests --------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        vertex_set: np.ndarray,
        payload: Any = None,
        slo_s: float | None = None,
    ) -> int:
        """Add a request (its k-hop vertex set ``U_r``); returns the ``buffer_id``
        of the buffer it joined. Its deadline is ``now + slo_s`` (default: the
        config's SLO)."""
        # a graph that gained vertices since the pool was sized: the tables grow
        u = as_vertex_set(vertex_set, 1 << 62)
        slo = self.config.slo_s if slo_s is None else float(slo_s)
        if slo <= 0:
            raise InvalidRequest("slo_s must be positive")
        with self._cond:
            if u.size and int(u[-1]) >= self.num_nodes:
                self._state.index.grow(int(u[-1]) + 1)
                self.num_nodes = self._state.num_nodes = self._state.index.num_nodes
            now = self.clock.now()
            req = PendingRequest(str(request_id), u, now, now + slo, payload)
            buffer_id, _, closed = self._state.submit(req, now)
            self._wake_ticker_if_due_sooner()
        self._deliver(closed)
        return buffer_id

    def finished(
        self, duration_s: float, requests: int, mean_wait_s: float, queued_s: float = 0.0
    ) -> None:
        """The execution of a closed buffer ended (see the class docstring);
        ``queued_s``: its calls' waits in the function pools' queues."""
        with self._cond:
            now = self.clock.now()
            closed = self._state.finished(now, duration_s, requests, mean_wait_s, queued_s)
            self._wake_ticker_if_due_sooner()
        self._deliver(closed)

    def tick(self) -> list[ClosedBuffer]:
        """Run what is due now: decision points, global moves, closes."""
        with self._cond:
            closed = self._state.advance(self.clock.now(), self._decide)
        self._deliver(closed)
        return closed

    def flush(self) -> list[ClosedBuffer]:
        """Close every open buffer now (reason ``"shutdown"``)."""
        with self._cond:
            closed = self._state.flush(self.clock.now())
        self._deliver(closed)
        return closed

    def next_event_time(self) -> float:
        with self._cond:
            return self._state.next_event_time()

    # -- background ticking ------------------------------------------------------------
    def start(self) -> None:
        """Tick in a background thread that sleeps until the next event (or a
        submit); for a :class:`~gnn_faas.clock.RealClock`."""
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="buffer-pool", daemon=True)
            self._thread.start()

    def stop(self, flush: bool = True) -> None:
        """Stop the ticker; by default also :meth:`flush`, so no request is left behind."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        if flush:
            self.flush()

    def _wake_ticker_if_due_sooner(self) -> None:
        """Under the lock, after a change: wake the sleeping ticker only when
        the next event now falls before it would wake. A request dispatched at
        once (or joining a buffer that closes later) then costs no thread
        wake-up, nor the ticker's grab of the GIL while the request runs."""
        wakes_at = self._ticker_wakes_at
        if wakes_at is not None and self._state.next_event_time() < wakes_at:
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                now = self.clock.now()
                wait = self._state.next_event_time() - now
                if wait > 0:
                    wait = min(wait, self.max_wait_s)
                    self._ticker_wakes_at = now + wait
                    try:
                        self._cond.wait(timeout=wait)
                    finally:
                        self._ticker_wakes_at = None
                    continue
            try:
                self.tick()
            except Exception:  # never let the ticker die: buffers would never close
                log.exception("buffer pool tick failed")

    # -- reporting -------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """Per open buffer: id, slot, requests ``N``, vertices ``K``, sharing
        degree ``S``, age and time to close (seconds), decisions so far."""
        with self._cond:
            now = self.clock.now()
            return [
                {
                    "buffer_id": b.buffer_id,
                    "slot": b.slot,
                    "requests": b.num_requests,
                    "vertices": b.union_size,
                    "sharing_degree": b.sharing_degree,
                    "age_s": now - b.opened_at,
                    "closes_in_s": b.close_at - now,
                    # None while the work-conserving gate holds the buffer with no
                    # deadline of its own (inf: JSON has none, /v1/status would 500)
                    "deadline_in_s": b.deadline - now if math.isfinite(b.deadline) else None,
                    "decisions": list(b.decisions),
                }
                for b in self._state.open_buffers()
            ]

    @property
    def stats(self) -> dict[str, Any]:
        with self._cond:
            s = self._state.stats()
        s["callback_errors"] = self.callback_errors
        return s

    # -- internals ---------------------------------------------------------------------
    def _decide(self, buffer: Buffer, state: np.ndarray, now: float) -> int:
        d = int(self.configurator.decide(state))
        if self.history is not None:
            self.history.record(buffer.buffer_id, now, state, d)
        return d

    def _deliver(self, closed: list[ClosedBuffer]) -> None:
        c = self.config
        for cb in closed:
            if self.history is not None:
                self.history.complete(cb.buffer_id, closed_gain(cb, c.alpha, c.beta, c.slo_s))
            try:
                self.on_close(cb)
            except Exception:
                # One failing callback must not keep the other buffers from delivery.
                self.callback_errors += 1
                log.exception("on_close failed for buffer %d", cb.buffer_id)

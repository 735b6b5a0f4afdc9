"""The gateway's dispatch on a simulated clock: buffers and function pools in one loop.

Work-conserving sharing (:mod:`gnn_faas.gateway.work_conserving`) closes a
buffer when an execution ends, so the buffers cannot be simulated ahead of the
function pools: this event loop runs both. Requests go through the gateway's
:class:`~gnn_faas.gateway.buffer_pool.BufferPoolState` (router, buffers, the
gate, the timeout tree); each closed buffer is one execution of ``T(|U_b|)``
seconds (the calibration's fit times a seeded draw of its measured ratios),
dispatched through the gateway's
:class:`~gnn_faas.scheduler.function_pool.LoadAwarePolicy` over a memory pool
and then a compute pool (``memory_share`` of ``T`` in the first, the rest in the
second, as :mod:`gnn_faas.traces.tandem` describes; one pool of pairs when the
calibration has no memory share), with cold starts and keep-alive; the end of
its last stage is reported back to the buffers (:meth:`BufferPoolState.finished`,
with the time the execution waited in the pools' queues). Under a launch budget
the two pools share one :class:`~gnn_faas.scheduler.function_pool.LaunchBudget`
(split by the calibration's function sizes, as the gateway's pools split it by
their specs') and each gives back an instance its policy calls surplus at the
next submit, as the gateway's keep-alive sweep does every second.
Without a buffer state every request is its own execution at its arrival
(``faas_gnn``: the same load-aware pools, no sharing).

Events at the same time run pools first, then buffers, then the arrival. The
loop is Python per event (a few per request and execution); the results are
arrays.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from gnn_faas.clock import FakeClock
from gnn_faas.gateway.buffer import PendingRequest
from gnn_faas.gateway.buffer_pool import BufferPoolState
from gnn_faas.scheduler.function_pool import IDLE, LaunchBudget, LoadAwarePolicy, Run
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.instance_pool import PoolRun
from gnn_faas.traces.request_stream import RequestStream
from gnn_faas.traces.tandem import TandemRun

_READY, _DONE = 0, 1


@dataclass(frozen=True)
class GatewayRun:
    """Per request: its execution and when that was dispatched; per execution
    (dispatch order): rows and requests; the pools' run (executions in the same
    order); the buffers' close reasons."""

    execution: np.ndarray
    dispatched: np.ndarray
    rows: np.ndarray
    requests: np.ndarray
    pools: PoolRun | TandemRun
    reasons: dict[str, int]
    gate: dict


class _Pool:
    """One function's instances under the load-aware policy, with the times
    the simulator reports (spawn, stop, per-execution start and end)."""

    def __init__(
        self, name, clock, cal: Calibration, cold_s: float, events: list, seq, policy_cls,
        budget: LaunchBudget | None, memory_mb: float,
    ):  # fmt: skip
        self.policy = policy_cls(
            cal.max_instances, clock=clock, name=name, budget=budget, memory_mb=memory_mb
        )
        self.clock = clock
        self.cold_s = cold_s
        self.keep_alive_s = cal.keep_alive_s
        self.events = events
        self.seq = seq
        self.spawn: dict = {}
        self.stop: dict = {}
        self.warm_at: dict = {}
        self.start: list[float] = []
        self.end: list[float] = []
        self.cold: list[bool] = []
        self.ready_at: list[float] = []
        self.service: list[float] = []
        for _ in range(cal.min_instances):
            launch = self.policy.launch()
            self.spawn[launch.instance] = self.warm_at[launch.instance] = 0.0
            self.policy.ready(launch.instance)
        self.prewarmed = cal.min_instances

    def submit(self, item: int, service_s: float, now: float) -> None:
        while len(self.start) <= item:
            self.start.append(0.0)
            self.end.append(0.0)
            self.cold.append(False)
            self.ready_at.append(0.0)
            self.service.append(0.0)
        self.ready_at[item] = now
        self.service[item] = service_s
        self._expire(now)
        self.act(self.policy.submit(item), now)

    def act(self, actions: list, now: float) -> None:
        for a in actions:
            if type(a) is Run:
                i = a.item
                self.start[i] = now
                self.end[i] = end = now + self.service[i]
                self.cold[i] = self.spawn[a.instance] >= self.ready_at[
                    i
                ] and now == self.warm_at.get(a.instance)
                heapq.heappush(self.events, (end, next(self.seq), _DONE, self, a.instance))
            else:  # Launch
                self.spawn[a.instance] = now
                ready = now + self.cold_s
                heapq.heappush(self.events, (ready, next(self.seq), _READY, self, a.instance))

    def event(self, kind: int, inst, now: float) -> int | None:
        """Apply a ready/done event; returns the item that finished, if any."""
        if kind == _READY:
            self.warm_at[inst] = now
            self.act(self.policy.ready(inst), now)
            return None
        item = self.policy.instances[inst].current
        self.act(self.policy.finished(inst), now)
        return item

    def _expire(self, now: float) -> None:
        """Idle instances past their keep-alive stop (checked before each
        submit: only a submit could have given them work)."""
        for inst, s in list(self.policy.instances.items()):
            if s.state == IDLE and s.since + self.keep_alive_s <= now and self.policy.remove(inst):
                self.stop[inst] = s.since + self.keep_alive_s
        surplus = self.policy.surplus()
        if surplus is not None and self.policy.remove(surplus):
            self.stop[surplus] = now

    def result(self, horizon: float) -> PoolRun:
        self._expire(horizon)
        for inst in self.spawn:
            if inst not in self.stop:
                s = self.policy.instances[inst]
                alive = s.since + self.keep_alive_s if s.state == IDLE else horizon
                self.stop[inst] = min(alive, horizon)
        ids = list(self.spawn)
        spawn = np.asarray([self.spawn[i] for i in ids])
        stop = np.maximum(np.asarray([self.stop[i] for i in ids]), spawn)
        return PoolRun(
            np.asarray(self.start),
            np.asarray(self.end),
            np.asarray(self.cold, dtype=bool),
            spawn,
            stop,
            prewarmed=self.prewarmed,
        )


def _stages(
    cal: Calibration,
    clock: FakeClock,
    events: list,
    seq: Iterator[int],
    policy_cls: type[LoadAwarePolicy],
    ratio: float | None,
) -> tuple[list[_Pool], list[float]]:
    """The pools an execution passes through and each one's share of its
    service time: one pool for the pair, or memory then compute when the
    calibration splits the time (``memory_share``); ``ratio``: the pools'
    launch budget (``LoadAwarePolicy``'s ``launch_wait_ratio``)."""
    budget = LaunchBudget(ratio) if ratio is not None else None
    memory_mb, compute_mb = cal.memory_function_mb, cal.compute_function_mb
    if cal.memory_share is None:
        pair = _Pool("pair", clock, cal, cal.cold_start_s, events, seq, policy_cls, budget,
                     memory_mb + compute_mb)  # fmt: skip
        return [pair], [1.0]
    stages = [
        _Pool("memory", clock, cal, cal.cold_start_memory_s, events, seq, policy_cls, budget,
              memory_mb),
        _Pool("compute", clock, cal, cal.cold_start_compute_s, events, seq, policy_cls, budget,
              compute_mb),
    ]  # fmt: skip
    return stages, [cal.memory_share, 1.0 - cal.memory_share]


def _service_draws(cal: Calibration, seed: int | None, n: int) -> tuple[list[float], list[int]]:
    """``(ratios, draws)``: the calibration's residual ratios (measured over
    fitted time; ``[1.0]`` without samples or a seed) and, per execution, which
    one scales its service time."""
    ratios = [1.0]
    if seed is not None and cal.samples:
        ratios = cal.residual_ratios().tolist()
    return ratios, np.random.default_rng(seed).integers(0, len(ratios), n).tolist()


def run_gateway(
    stream: RequestStream,
    cal: Calibration,
    state: BufferPoolState | None,
    decide: Callable | None = None,
    *,
    seed: int | None = 0,
    end_s: float = 0.0,
    progress: Callable[[int], None] | None = None,
    policy_cls: type[LoadAwarePolicy] = LoadAwarePolicy,
    launch_wait_ratio: float | None = None,
) -> GatewayRun:
    """Every request of ``stream`` through the buffers (``state``; None: none)
    and the function pools (module docstring); ``launch_wait_ratio``: the pools'
    launch budget (:class:`LoadAwarePolicy`; None: FaaS-GNN's launch rule)."""
    clock = FakeClock(0.0)
    events: list = []
    seq = iter(range(1 << 62))
    stages, shares = _stages(cal, clock, events, seq, policy_cls, launch_wait_ratio)
    a0, b0 = cal.exec_intercept_s, cal.exec_per_row_s
    ratios, draws = _service_draws(cal, seed, len(stream))

    n = len(stream)
    execution = np.empty(n, dtype=np.int64)
    dispatched = np.empty(n)
    rows: list[int] = []
    members: list[list[int]] = []
    exec_dispatch: list[float] = []
    exec_wait: list[float] = []
    arrivals = stream.arrivals.tolist()
    set_index = stream.set_index
    indptr, indices = stream.sets.indptr, stream.sets.indices
    sizes = stream.sizes

    def dispatch(ids: list[int], union: int, now: float) -> None:
        e = len(rows)
        rows.append(union)
        members.append(ids)
        exec_dispatch.append(now)
        exec_wait.append(sum(now - arrivals[i] for i in ids) / len(ids))
        execution[ids] = e
        dispatched[ids] = now
        t = (a0 + b0 * union) * ratios[draws[e % n]]
        clock.set(now)
        stages[0].submit(e, t * shares[0], now)

    def closed_buffers(closed: list, now: float) -> None:
        for cb in closed:
            dispatch([r.id for r in cb.requests], cb.union_size, now)

    def pool_event() -> None:
        t, _, kind, pool, inst = heapq.heappop(events)
        clock.set(t)
        e = pool.event(kind, inst, t)
        if e is None:
            return
        k = stages.index(pool)
        if k + 1 < len(stages):
            service = (stages[0].service[e] / shares[0]) * shares[k + 1]
            stages[k + 1].submit(e, service, t)
        elif state is not None:
            duration = t - exec_dispatch[e]
            queued = sum(p.start[e] - p.ready_at[e] for p in stages)
            closed_buffers(state.finished(t, duration, len(members[e]), exec_wait[e], queued), t)

    def run_until(t_end: float) -> None:
        while True:
            tp = events[0][0] if events else np.inf
            tb = state.next_event_time() if state is not None else np.inf
            t = min(tp, tb)
            if t > t_end or t == np.inf:
                return
            if tp <= tb:
                pool_event()
            else:
                clock.set(tb)
                closed_buffers(state.advance(tb, decide), tb)

    slo = state.config.slo_s if state is not None else 0.0
    step = max(n // 100, 1)
    for i in range(n):
        a = arrivals[i]
        run_until(a)
        if state is None:
            dispatch([i], int(sizes[i]), a)
        else:
            j = set_index[i]
            u = indices[indptr[j] : indptr[j + 1]]
            _, _, closed = state.submit(PendingRequest(i, u, a, a + slo), a)
            closed_buffers(closed, a)
        if progress is not None and i % step == 0:
            progress(i)
    run_until(np.inf)
    return _gateway_run(stages, state, end_s, execution, dispatched, rows, members)


def _gateway_run(
    stages: list[_Pool],
    state: BufferPoolState | None,
    end_s: float,
    execution: np.ndarray,
    dispatched: np.ndarray,
    rows: list[int],
    members: list[list[int]],
) -> GatewayRun:
    """The finished run: the pools' instance lives up to the horizon (``end_s``
    or the last execution's end), the buffers' close reasons and gate figures."""
    horizon = max(end_s, max((max(p.end, default=0.0) for p in stages), default=0.0))
    runs = [p.result(horizon) for p in stages]
    pools = runs[0] if len(runs) == 1 else TandemRun(runs[0], runs[1])
    reasons = dict(state.stats()["close_reasons"]) if state is not None else {}
    return GatewayRun(
        execution,
        dispatched,
        np.asarray(rows, dtype=np.int64),
        np.asarray([len(m) for m in members], dtype=np.int64),
        pools,
        reasons,
        state.gate.as_dict() if state is not None else {},
    )

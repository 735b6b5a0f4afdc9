"""The gateway's dispatch on a simulated clock: buffers and function pools in one loop.

Work-conserving sharing closes a buffer when an execution ends, so buffers and
pools are simulated together. Requests go through the gateway's
:class:`~gnn_faas.gateway.buffer_pool.BufferPoolState`; each closed buffer is
one execution of ``T(|U_b|)`` seconds dispatched through the gateway's
:class:`~gnn_faas.scheduler.function_pool.LoadAwarePolicy` over a memory pool
and then a compute pool (:mod:`gnn_faas.traces.tandem`), with cold starts,
keep-alive and a shared launch budget; its end is reported back to the buffers.
Without a buffer state every request is its own execution (``faas_gnn``).

Events at the same time run pools first, then buffers, then the arrival.
:meth:`GatewaySim.advance` runs every internal event up to a time; the caller
merges its inputs in time order (:meth:`GatewaySim.arrive`,
:meth:`GatewaySim.feed`), so another input stream merges in without touching
the loop. The pools are :mod:`gnn_faas.traces.sim_pools`'s. Results leave in
chunks to a sink (:class:`RunSink`): memory is
bounded by the work in flight. The rules that keep it fast, and the ``cost``
objective's tandem pass: docs/design/simulator.md.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gnn_faas.gateway.buffer import PendingRequest
from gnn_faas.gateway.buffer_pool import BufferPoolState
from gnn_faas.scheduler.function_pool import LaunchBudget, LoadAwarePolicy
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.instance_pool import PoolRun
from gnn_faas.traces.request_stream import RequestStream
from gnn_faas.traces.sim_gate import FusedGate
from gnn_faas.traces.sim_pools import (
    COLD,
    DISPATCHED,
    END,
    IDS,
    READY,
    READY_AT,
    SHARING,
    STAGE0,
    STAGE_WIDTH,
    START,
    WAIT,
    FusedBudget,
    FusedPool,
    ObjectPool,
)
from gnn_faas.traces.tandem import TandemRun

INF = math.inf
CHUNK = 1 << 15  # requests (and executions) per chunk handed to the sink (a power of 2)


class RunSink(Protocol):
    """Where a run's results go, in order (request chunks by index from 0,
    each stage's invocations by execution index from 0)."""

    def requests(self, lo: int, done: np.ndarray, cold: np.ndarray, dispatched: np.ndarray,
                 sharing: np.ndarray) -> None: ...  # fmt: skip

    def invocations(self, stage: int, start: np.ndarray, end: np.ndarray) -> None: ...


class SimClock:
    """The policies' clock in the simulator: the event loop sets ``t`` (never
    backwards), the policies read it; one thread, so no lock."""

    __slots__ = ("t",)

    def __init__(self, t: float = 0.0):
        self.t = float(t)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds


class _Ordered:
    """Records completed out of order, handed on in index order in chunks of
    :data:`CHUNK`: ``columns`` lists per chunk, emitted once every slot is set."""

    def __init__(self, columns: int, emit: Callable[[int, list[list]], None], total: int = -1):
        self.columns, self.emit, self.total = columns, emit, total
        self.chunks: dict[int, list] = {}
        self.next = 0  # the chunk to emit next

    def chunk(self, k: int) -> list:
        c = self.chunks.get(k)
        if c is None:
            size = CHUNK if self.total < 0 else min(CHUNK, self.total - k * CHUNK)
            c = self.chunks[k] = [size] + [[0.0] * size for _ in range(self.columns)]
        return c

    def done(self, k: int) -> None:
        """Chunk ``k`` is complete: emit it and every complete one after it, in order."""
        chunks = self.chunks
        while self.next in chunks and chunks[self.next][0] == 0:
            c = chunks.pop(self.next)
            self.emit(self.next * CHUNK, c[1:])
            self.next += 1

    def flush(self, count: int) -> None:
        """The run ended with ``count`` records: emit what is left (all set)."""
        while self.next * CHUNK < count:
            c = self.chunks.pop(self.next)
            size = min(CHUNK, count - self.next * CHUNK)
            self.emit(self.next * CHUNK, [col[:size] for col in c[1:]])
            self.next += 1


class GatewaySim:
    """The event loop of the module docstring, fed arrivals in order."""

    def __init__(
        self,
        stream: RequestStream,
        cal: Calibration,
        state: BufferPoolState | None,
        sink: RunSink,
        decide: Callable | None = None,
        *,
        seed: int | None = 0,
        policy_cls: type[LoadAwarePolicy] = LoadAwarePolicy,
        launch_wait_ratio: float | None = None,
        tandem: bool = False,
        fused: bool = True,
        reader: Any = None,
    ):
        self.stream, self.cal, self.state, self.sink = stream, cal, state, sink
        self.decide = decide
        self.tandem = tandem
        # LoadAwarePolicy's rule in the pools themselves (sim_pools.FusedPool), and a
        # request the gate dispatches alone counted without building its buffer
        # (BufferPoolState.submit_alone); False: the objects, for every policy_cls
        self.fused = fused and policy_cls is LoadAwarePolicy
        self.clock = SimClock(0.0)
        self.events: list = []
        self.seq = itertools.count()
        self.flight: dict[int, list] = {}  # executions in flight
        self.stages = self._stages(policy_cls, launch_wait_ratio)
        self.last_stage = len(self.stages) - 1
        self.stages[-1].last = True
        self.stages[0].reader = reader  # the stage that reads the graph (updates)
        ratios = np.ones(1)
        if seed is not None and cal.samples:
            ratios = cal.residual_ratios()
        self.draws = _Draws(seed, ratios)
        self.two = len(self.stages) == 2
        self.a0, self.b0 = cal.exec_intercept_s, cal.exec_per_row_s
        self.executions = 0
        self.rows_total = 0
        self.max_members = 0
        self.next_buffer_event = INF
        self.slo = state.config.slo_s if state is not None else 0.0
        n = len(stream)
        self.requests = _Ordered(4, self._emit_requests, n)
        self.invocations = _Ordered(2 * len(self.stages), self._emit_invocations)
        self.vertex_sets = stream.sets.views()
        # divmod(i, CHUNK) of an index i >= 0 as (i >> bits, i & slot)
        self.bits, self.slot = CHUNK.bit_length() - 1, CHUNK - 1
        assert 1 << self.bits == CHUNK, "CHUNK must be a power of 2"
        # an arrival the gate dispatches alone: BufferPoolState.submit_alone in one call
        self.alone = FusedGate(state).alone if state is not None and self.fused else None

    def _stages(self, policy_cls, ratio: float | None) -> list:
        """The pools an execution passes through (one of pairs, or memory then
        compute when the calibration splits its time) and their launch budget."""
        cal = self.cal
        if self.fused:
            budget = FusedBudget(ratio) if ratio is not None else None

            def pool(stage, name, cold_s, mb):
                return FusedPool(self, stage, name, cold_s, mb, budget)
        else:
            budget = LaunchBudget(ratio) if ratio is not None else None

            def pool(stage, name, cold_s, mb):
                return ObjectPool(self, stage, name, cold_s, mb, budget, policy_cls)

        m_mb, c_mb = cal.memory_function_mb, cal.compute_function_mb
        if cal.memory_share is None:
            self.shares = [1.0]
            return [pool(0, "pair", cal.cold_start_s, m_mb + c_mb)]
        self.shares = [cal.memory_share, 1.0 - cal.memory_share]
        return [
            pool(0, "memory", cal.cold_start_memory_s, m_mb),
            pool(1, "compute", cal.cold_start_compute_s, c_mb),
        ]

    # -- inputs ------------------------------------------------------------------------
    def advance(self, until: float) -> None:
        """Run every pool and buffer event at or before ``until``."""
        self._run(0, [], [], until)

    def arrive(self, i: int, a: float, j: int | None = None) -> None:
        """Request ``i`` arrives at ``a`` (after :meth:`advance` to ``a``;
        ``j``: its row of the stream's k-hop sets, looked up when not given)."""
        j = int(self.stream.set_index_of(i)) if j is None else j
        self._run(i, [a], [j], -INF)

    def feed(self, lo: int, arrivals: np.ndarray, set_index: np.ndarray,
             progress: Callable[[int], None] | None = None) -> None:  # fmt: skip
        """Requests ``lo, lo + 1, ...`` arriving at ``arrivals`` (sorted, after
        every earlier input), with their rows of the stream's k-hop sets: each
        after every event at or before it (the events after the last one wait
        for the next input)."""
        self._run(lo, arrivals.tolist(), set_index.tolist(), -INF)
        if progress is not None:
            progress(lo + int(arrivals.size))

    def _run(self, lo: int, arrivals: list, rows: list, until: float) -> None:
        """The loop: pool events first, then buffer events, then the next
        arrival, each in time order (ties as listed); past the last arrival,
        the events up to ``until``."""
        events, state, clock, flight = self.events, self.state, self.clock, self.flight
        first, second = self.stages[0], self.stages[-1]
        hand_off = STAGE0 + STAGE_WIDTH + READY_AT  # the compute stage's ready time
        pop = heapq.heappop
        sets, sizes, slo = self.vertex_sets, self.stream.sets.sizes_list(), self.slo
        alone = self.alone
        n, k = len(arrivals), 0
        a = arrivals[0] if n else until
        while True:
            tp = events[0][0] if events else INF
            tb = self.next_buffer_event
            if tp <= tb and tp <= a:
                if tp == INF:
                    return
                t, _, kind, pool, inst = pop(events)
                if t > clock.t:
                    clock.t = t
                if kind == READY:
                    pool.ready(inst, t)
                    continue
                e = pool.done(inst, t)
                if pool is first and first is not second:  # on to the compute stage
                    flight[e][hand_off] = t
                    second.enter(e, t)
                else:
                    self._executed(e, t)
            elif tb < tp and tb <= a:
                if tb > clock.t:
                    clock.t = tb
                self._closed(state.advance(tb, self.decide), tb)
            elif k < n:  # the arrival
                if a > clock.t:
                    clock.t = a
                i, j = lo + k, rows[k]
                k += 1
                if state is None:
                    self._dispatch([i], sizes[j], 0.0, a, 0.0)
                elif alone is not None and alone(sizes[j], a):  # no buffer open: none after it
                    self._dispatch([i], sizes[j], 0.0, a, 0.0)
                    self.next_buffer_event = INF
                else:
                    _, _, closed = state.submit(PendingRequest(i, sets[j], a, a + slo), a)
                    if closed:
                        self._closed(closed, a)
                    else:
                        self.next_buffer_event = state.next_event_time()
                a = arrivals[k] if k < n else until
            else:
                return

    # -- executions ------------------------------------------------------------------
    def _closed(self, closed: list, now: float) -> None:
        for cb in closed:
            reqs = cb.requests
            if len(reqs) == 1:
                r = reqs[0]
                ids, wait = [r.id], now - r.arrival  # the mean of one wait
            else:
                ids = [r.id for r in reqs]
                wait = sum(now - r.arrival for r in reqs) / len(ids)
            sharing = 1.0 - cb.union_size / max(cb.total_vertices, 1)
            self._dispatch(ids, cb.union_size, sharing, now, wait)
        if self.state is not None:
            self.next_buffer_event = self.state.next_event_time()

    def _dispatch(self, ids: list, union: int, sharing: float, now: float, wait: float) -> None:
        """One execution of ``ids`` (``union`` rows) dispatched at ``now``, its
        requests' mean buffer wait ``wait``: ``T = (a + b·rows)·ratio`` split
        over the stages (the compute stage's share fixed now)."""
        e = self.executions
        self.executions = e + 1
        self.rows_total += union
        if len(ids) > self.max_members:
            self.max_members = len(ids)
        draws = self.draws
        k = e - draws.base
        if k >= draws.size:
            draws.refill(e)
            k = 0
        t = (self.a0 + self.b0 * union) * draws.block[k]
        s0 = self.shares[0]
        first = t * s0
        if self.two:
            s1 = self.shares[1]
            rest = t * s1 if self.tandem else (first / s0) * s1
        else:
            rest = 0.0
        self.flight[e] = [ids, union, now, wait, sharing,
                          now, first, 0.0, 0.0, False, 0.0, rest, 0.0, 0.0, False]  # fmt: skip
        self.stages[0].enter(e, now)

    def _executed(self, e: int, t: float) -> None:
        """Execution ``e``'s last stage ended at ``t``: the buffers hear of it
        (unless ``tandem``), with its waits in the pools' queues."""
        rec = self.flight.pop(e)
        state = self.state
        if state is None or self.tandem:
            return
        queued = rec[STAGE0 + START] - rec[STAGE0 + READY_AT]
        if self.two:
            b = STAGE0 + STAGE_WIDTH
            queued += rec[b + START] - rec[b + READY_AT]
        if self.fused and not state.location:  # no buffer open: none to release
            state.gate.finished(t - rec[DISPATCHED], len(rec[IDS]), rec[WAIT], queued)
            self.next_buffer_event = INF
            return
        closed = state.finished(t, t - rec[DISPATCHED], len(rec[IDS]), rec[WAIT], queued)
        if closed:
            self._closed(closed, t)
        else:
            self.next_buffer_event = state.next_event_time()

    def complete(self, e: int, rec: list) -> None:
        """Execution ``e``'s last stage started: its requests' results are known."""
        end = rec[STAGE0 + STAGE_WIDTH * self.last_stage + END]
        bits, mask = self.bits, self.slot
        k, slot = e >> bits, e & mask
        inv = self.invocations
        c = inv.chunks.get(k) or inv.chunk(k)
        if self.two:
            m, n = STAGE0, STAGE0 + STAGE_WIDTH
            cold = rec[m + COLD] or rec[n + COLD]
            c[1][slot], c[2][slot] = rec[m + START], rec[m + END]
            c[3][slot], c[4][slot] = rec[n + START], end
        else:
            cold = rec[STAGE0 + COLD]
            c[1][slot], c[2][slot] = rec[STAGE0 + START], end
        c[0] -= 1
        if c[0] == 0:
            inv.done(k)
        req = self.requests
        dispatched, sharing = rec[DISPATCHED], rec[SHARING]
        chunks = req.chunks
        for i in rec[IDS]:
            k, j = i >> bits, i & mask
            c = chunks.get(k) or req.chunk(k)
            _, c_done, c_cold, c_dispatched, c_sharing = c
            c_done[j] = end
            c_cold[j] = cold
            c_dispatched[j] = dispatched
            c_sharing[j] = sharing
            c[0] -= 1
            if c[0] == 0:
                req.done(k)

    def _emit_requests(self, lo: int, cols: list[list]) -> None:
        done, cold, dispatched, sharing = cols
        self.sink.requests(lo, np.asarray(done, np.float64), np.asarray(cold, bool),
                           np.asarray(dispatched, np.float64), np.asarray(sharing, np.float64))  # fmt: skip

    def _emit_invocations(self, lo: int, cols: list[list]) -> None:
        for j in range(len(self.stages)):
            self.sink.invocations(j, np.asarray(cols[2 * j], np.float64),
                                  np.asarray(cols[2 * j + 1], np.float64))  # fmt: skip

    # -- the end -----------------------------------------------------------------------
    def finish(self, end_s: float) -> GatewayResult:
        """Run what is left; the pools' instance lives up to the horizon
        (``end_s`` or the last execution's end: one for both pools, or each
        pool's own under ``tandem``), the buffers' figures."""
        self.advance(INF)
        self.requests.flush(len(self.stream))
        self.invocations.flush(self.executions)
        common = max(end_s, max(p.last_end for p in self.stages))
        lives = [p.lives(max(end_s, p.last_end) if self.tandem else common) for p in self.stages]
        state = self.state
        return GatewayResult(
            lives=lives,
            prewarmed=[p.prewarmed for p in self.stages],
            executions=self.executions,
            rows_total=self.rows_total,
            max_members=self.max_members,
            reasons=dict(state.stats()["close_reasons"]) if state is not None else {},
            gate=state.gate.as_dict() if state is not None else {},
        )


@dataclass(frozen=True)
class GatewayResult:
    """What a finished :class:`GatewaySim` reports beyond its sink: per pool the
    instances' ``(spawn, stop)`` and how many were warm before the run; the
    executions and their rows; the buffers' close reasons and gate figures."""

    lives: list[tuple[np.ndarray, np.ndarray]]
    prewarmed: list[int]
    executions: int
    rows_total: int
    max_members: int
    reasons: dict[str, int]
    gate: dict


class _Draws:
    """Per execution, the measured ratio that scales its service time:
    ``ratios[i]`` for ``i`` the sequence ``default_rng(seed).integers(0, k, n)``
    would give, drawn in blocks as executions come (numpy draws these the same
    in blocks): execution ``e``'s is ``block[e − base]``."""

    BLOCK = 1 << 16

    def __init__(self, seed: int | None, ratios: np.ndarray):
        self.rng = np.random.default_rng(seed)
        self.ratios = np.asarray(ratios, dtype=np.float64)
        self.block: list[float] = []
        self.size = 0
        self.base = 0

    def refill(self, e: int) -> None:
        """The next block (``e``: the first execution past the current one)."""
        self.base += self.size
        self.block = self.ratios[self.rng.integers(0, self.ratios.size, self.BLOCK)].tolist()
        self.size = len(self.block)
        assert self.base == e


# -- whole runs in memory (tests, the live comparison) ------------------------------------


@dataclass(frozen=True)
class GatewayRun:
    """Per request: its completion, whether it waited for a cold start, when
    it was dispatched and its buffer's sharing degree; the pools' run (per
    execution in dispatch order, per instance); the buffers' close reasons and
    gate figures; executions, their rows and most requests in one."""

    done: np.ndarray
    cold: np.ndarray
    dispatched: np.ndarray
    sharing: np.ndarray
    pools: PoolRun | TandemRun
    reasons: dict[str, int]
    gate: dict
    executions: int
    rows_total: int
    max_members: int


class ArraySink:
    """A :class:`RunSink` that keeps everything (a whole run in memory)."""

    def __init__(self, stages: int):
        self.req: list[tuple] = []
        self.inv: list[list[tuple]] = [[] for _ in range(stages)]

    def requests(self, lo, done, cold, dispatched, sharing) -> None:
        self.req.append((done, cold, dispatched, sharing))

    def invocations(self, stage, start, end) -> None:
        self.inv[stage].append((start, end))

    def request_arrays(self) -> list[np.ndarray]:
        if not self.req:
            return [np.zeros(0), np.zeros(0, bool), np.zeros(0), np.zeros(0)]
        return [np.concatenate(c) for c in zip(*self.req, strict=True)]

    def stage_arrays(self, stage: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.inv[stage]:
            return np.zeros(0), np.zeros(0)
        s, e = zip(*self.inv[stage], strict=True)
        return np.concatenate(s), np.concatenate(e)


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
    tandem: bool = False,
    sink: RunSink | None = None,
    fused: bool = True,
    reader: Any = None,
) -> GatewayRun | GatewayResult:
    """Every request of ``stream`` through the buffers (``state``; None: none)
    and the function pools (module docstring); ``launch_wait_ratio``: the pools'
    launch budget (:class:`LoadAwarePolicy`; None: FaaS-GNN's launch rule).
    With a ``sink`` the results go there in chunks and the
    :class:`GatewayResult` comes back; without one, the whole
    :class:`GatewayRun`. ``reader``: told of every call of the first stage
    (:class:`~gnn_faas.traces.update_cost.UpdateReader`)."""
    keep = sink is None
    stages = 1 if cal.memory_share is None else 2
    out = ArraySink(stages) if keep else sink
    sim = GatewaySim(stream, cal, state, out, decide, seed=seed, policy_cls=policy_cls,
                     launch_wait_ratio=launch_wait_ratio, tandem=tandem,
                     fused=fused, reader=reader)  # fmt: skip
    for lo, arrivals, set_index in stream.chunks():
        sim.feed(lo, arrivals, set_index, progress)
    res = sim.finish(end_s)
    if not keep:
        return res
    done, cold, dispatched, sharing = out.request_arrays()
    runs = []
    for k, (spawn, stop) in enumerate(res.lives):
        start, end = out.stage_arrays(k)
        runs.append(PoolRun(start, end, np.zeros(start.size, bool), spawn, stop, res.prewarmed[k]))
    pools = runs[0] if len(runs) == 1 else TandemRun(runs[0], runs[1])
    return GatewayRun(done, cold, dispatched, sharing, pools, res.reasons, res.gate,
                      res.executions, res.rows_total, res.max_members)  # fmt: skip

"""Discrete-event simulation of a request trace under each serving policy.

Every policy runs on the same :class:`~gnn_faas.traces.request_stream.RequestStream`
(arrivals mapped onto the graph's real request order, k-hop sets computed once per
vertex) and the same measured :class:`~gnn_faas.traces.calibration.Calibration`
(service time ``T(rows)`` times a seeded draw of the measured samples' ratio to the
fit, cold starts, memory sizes). Policies:

- ``gnn_faas``: the gateway's own policy code on a simulated clock: requests go
  through :class:`~gnn_faas.gateway.buffer_pool.BufferPoolState` (router,
  multi-buffers, timeouts or the work-conserving gate, global optimiser); each
  closed buffer is one execution of ``T(|U_b|)`` (``U_b``: the union of its
  requests' k-hop sets) dispatched by the gateway's
  :class:`~gnn_faas.scheduler.function_pool.LoadAwarePolicy` over a memory and a
  compute pool in series that scale apart (:mod:`gnn_faas.traces.tandem`);
- ``faas_gnn``: FaaS-GNN without graph sharing: one execution of ``T(|U_r|)`` per
  request, load-aware queueing, memory and compute pools as for ``gnn_faas``;
- ``request_centric`` (AWSGNN): one execution per request, a new instance when none
  is idle (the request waits for the cold start), sized for the largest request;
- ``dgl_serverless``: ``request_centric`` whose cold starts also download the whole
  graph (measured ``full_fetch_s``);
- ``serverful``: always-on instances holding the graph, one FIFO queue, re-planned
  every minute to at most 80% utilisation (``n_k = ⌈W_{k−1} / (0.8·60 s)⌉``).

A request whose answer would take longer than ``timeout_s`` is dropped; every
arrival is either completed or dropped. GB-s is ``Σ_instances memory/1024·(stop −
spawn)``, the integral of the allocated-GB timeline.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gnn_faas.clock import FakeClock
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer import PendingRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState
from gnn_faas.scheduler.function_pool import IDLE, LoadAwarePolicy, Run
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import Price, dollars
from gnn_faas.traces.gateway_sim import run_gateway
from gnn_faas.traces.instance_pool import PoolRun, run_pool
from gnn_faas.traces.request_stream import RequestStream
from gnn_faas.traces.tandem import TandemRun, run_tandem
from gnn_faas.traces.timeline import counts_per_second, coverage, in_flight

POLICIES = ("gnn_faas", "faas_gnn", "request_centric", "dgl_serverless", "serverful")
SERVERFUL_UTILISATION = 0.8
SERVERFUL_INTERVAL_S = 60.0
PARALLEL_MIN_REQUESTS = 50_000  # below this a serial buffer pass is quicker than forking


@dataclass
class PolicyRun:
    """One policy's simulated run: per request, per invocation, per instance."""

    name: str
    arrivals: np.ndarray
    done: np.ndarray  # completion time per request (inf when dropped)
    cold: np.ndarray  # request waited for a cold start
    buffer_wait: np.ndarray
    sharing: np.ndarray  # sharing degree of the request's buffer (0 without one)
    dropped: np.ndarray
    inv_start: np.ndarray  # per execution
    inv_end: np.ndarray
    inv_mb: np.ndarray  # memory of the instance running it
    inst_spawn: np.ndarray
    inst_stop: np.ndarray
    inst_mb: np.ndarray
    inst_vcpus: np.ndarray
    cold_starts: int
    serverful: bool
    billing: tuple[
        tuple[float, float], ...
    ]  # per function: (memory MB, vCPUs) billed per execution
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # per invocation, which ``billing`` function ran it (memory and compute pools
    # simulated apart); None: each execution is billed once per function
    inv_fn: np.ndarray | None = None

    @property
    def latency(self) -> np.ndarray:
        return np.where(self.dropped, np.nan, self.done - self.arrivals)

    @property
    def gb_s(self) -> float:
        return float(np.sum((self.inst_stop - self.inst_spawn) * self.inst_mb) / 1024.0)

    @property
    def vcpu_s(self) -> float:
        return float(np.sum((self.inst_stop - self.inst_spawn) * self.inst_vcpus))

    @property
    def busy_gb_s(self) -> float:
        return float(np.sum((self.inv_end - self.inv_start) * self.inv_mb) / 1024.0)

    def after(self, t0: float) -> PolicyRun:
        """The run as measured from ``t0`` on, with times shifted so ``t0`` is 0:
        the requests arriving at or after ``t0``, the executions starting then,
        and every instance alive after ``t0`` with its life clipped to start
        there (so GB-s is the allocated-GB integral over the measured window).
        A live replay with ``--warmup`` is measured the same way."""
        if t0 <= 0:
            return self
        r = self.arrivals >= t0
        e = self.inv_start >= t0
        i = self.inst_stop > t0
        return replace(
            self,
            arrivals=self.arrivals[r] - t0,
            done=self.done[r] - t0,
            cold=self.cold[r],
            buffer_wait=self.buffer_wait[r],
            sharing=self.sharing[r],
            dropped=self.dropped[r],
            inv_start=self.inv_start[e] - t0,
            inv_end=self.inv_end[e] - t0,
            inv_mb=self.inv_mb[e],
            inst_spawn=np.maximum(self.inst_spawn[i], t0) - t0,
            inst_stop=self.inst_stop[i] - t0,
            inst_mb=self.inst_mb[i],
            inst_vcpus=self.inst_vcpus[i],
            cold_starts=int((self.inst_spawn >= t0).sum()),
            inv_fn=None if self.inv_fn is None else self.inv_fn[e],
        )

    def horizon(self) -> int:
        ends = [self.arrivals.max(initial=0.0), self.inst_stop.max(initial=0.0)]
        ends.append(self.inv_end.max(initial=0.0))
        return max(int(math.ceil(max(ends))), 1)

    def timeline(self, seconds: int | None = None) -> dict[str, np.ndarray]:
        """Every second: arrivals, completions, in flight, instances, allocated and busy GB."""
        n = seconds or self.horizon()
        ok = ~self.dropped
        return {
            "second": np.arange(n),
            "arrivals": counts_per_second(self.arrivals, n),
            "completions": counts_per_second(self.done[ok], n),
            "in_flight": in_flight(self.arrivals, np.where(ok, self.done, np.inf), n),
            "instances": coverage(self.inst_spawn, self.inst_stop, 1.0, n),
            "allocated_gb": coverage(self.inst_spawn, self.inst_stop, self.inst_mb / 1024.0, n),
            "busy_gb": coverage(self.inv_start, self.inv_end, self.inv_mb / 1024.0, n),
        }

    def peak(self) -> tuple[float, float]:
        """Peak (vCPUs, GiB) alive at once (at instance spawns)."""
        if self.inst_spawn.size == 0:
            return 0.0, 0.0
        t = np.concatenate([self.inst_spawn, self.inst_stop])
        order = np.argsort(t, kind="stable")
        # stops sort before spawns at the same time (a replacement is not a peak)
        kind = np.concatenate([np.ones(self.inst_spawn.size), -np.ones(self.inst_stop.size)])
        order = np.lexsort((kind, t))
        v = np.concatenate([self.inst_vcpus, -self.inst_vcpus])[order]
        g = np.concatenate([self.inst_mb, -self.inst_mb])[order] / 1024.0
        return float(np.cumsum(v).max()), float(np.cumsum(g).max())

    def summary(self, slo_s: float, prices: dict[str, Price], duration_s: float) -> dict:
        lat = self.latency[~self.dropped]
        n = int(self.arrivals.size)
        q = np.percentile(lat, [50, 99]) * 1e3 if lat.size else np.zeros(2)
        d = self.inv_end - self.inv_start
        if self.inv_fn is not None:  # each stage billed to its own function
            durations, executions = d, int((self.inv_fn == 0).sum())
            mb = np.asarray([m for m, _ in self.billing])[self.inv_fn]
            vcpus = np.asarray([v for _, v in self.billing])[self.inv_fn]
        else:
            durations, executions = np.concatenate([d for _ in self.billing]), int(d.size)
            mb = np.concatenate([np.full(d.size, m) for m, _ in self.billing])
            if self.name == "request_centric" and "request_mb" in self.extra:
                mb[: d.size] = self.extra["request_mb"]
            vcpus = np.concatenate([np.full(d.size, v) for _, v in self.billing])
        peak_vcpus, peak_gib = self.peak()
        return {
            "requests": n,
            "completed": int(n - self.dropped.sum()),
            "dropped": int(self.dropped.sum()),
            "p50_ms": float(q[0]),
            "p99_ms": float(q[1]),
            "mean_ms": float(lat.mean() * 1e3) if lat.size else 0.0,
            "slo_violations": int((lat > slo_s).sum() + self.dropped.sum()),
            "gb_s": self.gb_s,
            "busy_gb_s": self.busy_gb_s,
            "vcpu_s": self.vcpu_s,
            "gb_s_per_request": self.gb_s / max(n, 1),
            "cold_starts": int(self.cold_starts),
            "cold_requests": int(self.cold.sum()),
            "executions": executions,
            "peak_instances": int(round(self.peak_instances())),
            "mean_memory_gb": self.gb_s / max(duration_s, 1e-9),
            "mean_sharing_degree": float(self.sharing.mean()) if n else 0.0,
            "dollars": dollars(
                prices,
                serverful=self.serverful,
                durations_s=durations,
                memory_mb=mb,
                vcpus=vcpus,
                duration_s=duration_s,
                peak_vcpus=peak_vcpus,
                peak_gib=peak_gib,
                requests=n,
            ),
            "wall_s": self.wall_s,
            **{k: v for k, v in self.extra.items() if k != "request_mb"},
        }

    def peak_instances(self) -> float:
        if self.inst_spawn.size == 0:
            return 0.0
        t = np.concatenate([self.inst_spawn, self.inst_stop])
        kind = np.concatenate([np.ones(self.inst_spawn.size), -np.ones(self.inst_stop.size)])
        order = np.lexsort((kind, t))
        return float(np.cumsum(kind[order]).max())


# -- gnn_faas: the gateway's own code on a fake clock -----------------------------------


def run_buffers(
    stream: RequestStream,
    config: BufferConfig,
    configurator: Any,
    num_nodes: int,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, list, BufferPoolState]:
    """Every request through :class:`BufferPoolState` (router, buffers, timeout
    decisions, global moves). Returns per request its close time and execution
    index, the closed buffers in close order, and the final state."""
    state = BufferPoolState(config, num_nodes)

    def decide(b, s, now):  # the configurator the gateway would call
        return int(configurator.decide(s))

    n = len(stream)
    close = np.empty(n)
    exec_of = np.empty(n, dtype=np.int64)
    closed_all: list = []
    arrivals = stream.arrivals.tolist()
    set_index = stream.set_index
    indptr, indices = stream.sets.indptr, stream.sets.indices
    slo = config.slo_s

    def take(closed: list) -> None:
        for cb in closed:
            e = len(closed_all)
            closed_all.append(cb)
            ids = [r.id for r in cb.requests]
            close[ids] = cb.closed_at
            exec_of[ids] = e

    next_event = math.inf
    step = max(n // 100, 1)
    for i in range(n):
        a = arrivals[i]
        while next_event <= a:
            take(state.advance(next_event, decide))
            next_event = state.next_event_time()
        j = set_index[i]
        u = indices[indptr[j] : indptr[j + 1]]
        _, _, closed = state.submit(PendingRequest(i, u, a, a + slo), a)
        if closed:
            take(closed)
        next_event = state.next_event_time()
        if progress is not None and i % step == 0:
            progress(i)
    while next_event < math.inf:
        take(state.advance(next_event, decide))
        next_event = state.next_event_time()
    return close, exec_of, closed_all, state


def run_load_aware(
    ready: np.ndarray,
    service: np.ndarray,
    *,
    cold_s: float,
    keep_alive_s: float,
    max_instances: int,
    min_instances: int,
    policy_cls: type[LoadAwarePolicy] = LoadAwarePolicy,
    end_s: float = 0.0,
) -> PoolRun:
    """Executions (sorted by ``ready``) dispatched by the gateway's load-aware
    policy on a fake clock: launches become ready ``cold_s`` later, runs take
    ``service`` seconds, idle instances stop after ``keep_alive_s``."""
    n = int(ready.size)
    clock = FakeClock(0.0)
    policy = policy_cls(max_instances, clock=clock, name="pair")
    sim = _LoadAwareRun(policy, clock, ready.tolist(), service.tolist(), cold_s, keep_alive_s)
    sim.prewarm(min_instances)
    for i in range(n):
        a = sim.ready[i]
        sim.run_events(a)
        sim.clock.set(a)
        sim.expire(a)
        sim.act(sim.policy.submit(i), a)
    horizon = max(end_s, max(sim.end, default=0.0))
    sim.run_events(horizon)
    sim.expire(horizon)
    spawn, stop = sim.lives(horizon)
    return PoolRun(
        np.asarray(sim.start),
        np.asarray(sim.end),
        sim.cold,
        spawn,
        np.maximum(stop, spawn),
        prewarmed=min_instances,
    )


class _LoadAwareRun:
    """The state of :func:`run_load_aware`: the policy on its fake clock, the
    event heap ``(time, seq, kind: 0 ready / 1 finished, instance)``, each
    instance's spawn, warm and stop times, each execution's start and end."""

    def __init__(
        self,
        policy: LoadAwarePolicy,
        clock: FakeClock,
        ready: list[float],
        service: list[float],
        cold_s: float,
        keep_alive_s: float,
    ):
        self.policy, self.clock = policy, clock
        self.ready, self.service = ready, service
        self.cold_s, self.keep_alive_s = cold_s, keep_alive_s
        n = len(ready)
        self.cold = np.zeros(n, dtype=bool)
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.spawn: dict[Any, float] = {}
        self.warm_at: dict[Any, float] = {}
        self.stop: dict[Any, float] = {}
        self.events: list = []
        self.seq = 0

    def prewarm(self, count: int) -> None:
        """``count`` instances warm at time 0 (launched before the trace)."""
        for _ in range(count):
            launch = self.policy.launch()
            self.spawn[launch.instance] = self.warm_at[launch.instance] = 0.0
            self.policy.ready(launch.instance)

    def act(self, actions: list, now: float) -> None:
        for a in actions:
            if type(a) is Run:
                i = a.item
                self.start[i] = now
                self.end[i] = e = now + self.service[i]
                self.cold[i] = self.spawn[a.instance] >= self.ready[i] and now == self.warm_at.get(
                    a.instance
                )
                heapq.heappush(self.events, (e, self.seq, 1, a.instance))
            else:  # Launch
                self.spawn[a.instance] = now
                heapq.heappush(self.events, (now + self.cold_s, self.seq, 0, a.instance))
            self.seq += 1

    def expire(self, now: float) -> None:
        """Idle instances past their keep-alive stop (checked lazily before each
        submit: only a submit could have given them work)."""
        for inst, s in list(self.policy.instances.items()):
            if s.state == IDLE and s.since + self.keep_alive_s <= now and self.policy.remove(inst):
                self.stop[inst] = s.since + self.keep_alive_s

    def run_events(self, until: float) -> None:
        events = self.events
        while events and events[0][0] <= until:
            t, _, kind, inst = heapq.heappop(events)
            self.clock.set(t)
            if kind == 0:
                self.warm_at[inst] = t
                self.act(self.policy.ready(inst), t)
            else:
                self.act(self.policy.finished(inst), t)

    def lives(self, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        """``(spawn, stop)`` per instance in launch order; those still alive at
        the end stop when their keep-alive ends or the run does."""
        for inst in self.spawn:
            if inst not in self.stop:
                s = self.policy.instances[inst]
                self.stop[inst] = (
                    min(s.since + self.keep_alive_s, horizon) if s.state == IDLE else horizon
                )
        ids = list(self.spawn)
        return (
            np.asarray([self.spawn[i] for i in ids]),
            np.asarray([self.stop[i] for i in ids]),
        )


@dataclass(frozen=True)
class SimulationSetup:
    """What every policy shares."""

    stream: RequestStream
    calibration: Calibration
    num_nodes: int
    duration_s: float
    buffer_config: BufferConfig
    configurator: Any
    timeout_s: float = 30.0
    policy_cls: type[LoadAwarePolicy] = LoadAwarePolicy
    workers: int = 1  # processes for the gnn_faas buffer pass
    seed: int | None = 0  # draws of measured service-time variation (None: the fit alone)


def _finish(
    name: str,
    setup: SimulationSetup,
    pool: PoolRun | TandemRun,
    billing: tuple[tuple[float, float], ...],
    *,
    request_exec: np.ndarray | None = None,
    serverful: bool = False,
    buffer_wait: np.ndarray | None = None,
    sharing: np.ndarray | None = None,
    extra: dict | None = None,
) -> PolicyRun:
    """The policy's run from its pool(s). ``billing``: per function, (memory
    MB, vCPUs). A :class:`TandemRun` has a memory and a compute pool: its
    invocations are the stages (``inv_fn`` 0 and 1, billed as ``billing[0]``
    and ``billing[1]``), its instances both pools' at their own sizes; a
    :class:`PoolRun` is one pool whose instances hold every function (their
    memory and vCPUs summed), each execution billed once per function.
    ``request_exec``: each request's execution (default: its own)."""
    inst_mb = float(sum(mb for mb, _ in billing))
    inst_vcpus = float(sum(v for _, v in billing))
    arr = setup.stream.arrivals
    idx = request_exec if request_exec is not None else np.arange(arr.size)
    done = pool.end[idx]
    dropped = done - arr > setup.timeout_s
    inv_fn = None
    if isinstance(pool, TandemRun):
        stages = (pool.memory, pool.compute)
        (m_mb, m_cpu), (c_mb, c_cpu) = billing
        inv_start = np.concatenate([p.start for p in stages])
        inv_end = np.concatenate([p.end for p in stages])
        inv_fn = np.repeat([0, 1], [p.start.size for p in stages])
        inv_mb = np.where(inv_fn == 0, m_mb, c_mb)
        spawn = np.concatenate([p.spawn for p in stages])
        stop = np.concatenate([p.stop for p in stages])
        kind = np.repeat([0, 1], [p.spawn.size for p in stages])
        mb, vcpus = np.where(kind == 0, m_mb, c_mb), np.where(kind == 0, m_cpu, c_cpu)
    else:
        inv_start, inv_end = pool.start, pool.end
        inv_mb = np.full(pool.start.size, inst_mb)
        spawn, stop = pool.spawn, pool.stop
        mb, vcpus = np.full(spawn.size, inst_mb), np.full(spawn.size, inst_vcpus)
    return PolicyRun(
        name=name,
        arrivals=arr,
        done=np.where(dropped, np.inf, done),
        cold=pool.cold[idx],
        buffer_wait=buffer_wait if buffer_wait is not None else np.zeros(arr.size),
        sharing=sharing if sharing is not None else np.zeros(arr.size),
        dropped=dropped,
        inv_start=inv_start,
        inv_end=inv_end,
        inv_mb=inv_mb,
        inst_spawn=spawn,
        inst_stop=stop,
        inst_mb=mb.astype(np.float64),
        inst_vcpus=vcpus.astype(np.float64),
        cold_starts=pool.cold_starts,
        serverful=serverful,
        billing=billing,
        extra=extra or {},
        inv_fn=inv_fn,
    )


def _function_pools(setup: SimulationSetup, run_stage: Callable[..., PoolRun],
                    ready: np.ndarray, service: np.ndarray) -> PoolRun | TandemRun:  # fmt: skip
    """Memory and compute pools in series when the calibration measured the
    memory share (as the gateway runs them), else memory+compute pairs.
    ``run_stage(ready, service, cold_s)`` is one pool's pass."""
    cal = setup.calibration
    if cal.memory_share is None:
        return run_stage(ready, service, cal.cold_start_s)
    return run_tandem(
        ready, service, cal.memory_share,
        lambda r, sv: run_stage(r, sv, cal.cold_start_memory_s),
        lambda r, sv: run_stage(r, sv, cal.cold_start_compute_s),
    )  # fmt: skip


@dataclass(frozen=True)
class BufferPass:
    """Per request: when its buffer closed, which execution (buffer) it is in,
    that buffer's union size and sharing degree; plus the pool's close reasons."""

    close: np.ndarray
    execution: np.ndarray
    union: np.ndarray
    sharing: np.ndarray
    reasons: dict[str, int]


def buffer_pass(stream: RequestStream, config: BufferConfig, configurator: Any,
                num_nodes: int, progress=None) -> BufferPass:  # fmt: skip
    close, exec_of, closed, state = run_buffers(stream, config, configurator, num_nodes, progress)
    union = np.fromiter((cb.union_size for cb in closed), np.int64, len(closed))
    sharing = np.fromiter((cb.sharing_degree for cb in closed), float, len(closed))
    return BufferPass(close, exec_of, union[exec_of], sharing[exec_of],
                      dict(state.stats()["close_reasons"]))  # fmt: skip


def parallel_buffer_pass(
    stream: RequestStream,
    config: BufferConfig,
    configurator: Any,
    num_nodes: int,
    workers: int,
    progress=None,
    lead_s: float = 5.0,
    min_requests: int | None = None,
) -> BufferPass:
    """See :func:`start_buffer_pass` (this one waits for the result)."""
    return start_buffer_pass(
        stream, config, configurator, num_nodes, workers, progress, lead_s, min_requests
    )()


def start_buffer_pass(
    stream: RequestStream,
    config: BufferConfig,
    configurator: Any,
    num_nodes: int,
    workers: int,
    progress=None,
    lead_s: float = 5.0,
    min_requests: int | None = None,
) -> Callable[[], BufferPass]:
    """:func:`buffer_pass` over ``workers`` consecutive slices of the stream in
    forked processes (the gateway's code is Python per request; a day of
    arrivals needs more than one core). Each slice after the first replays the
    ``lead_s`` seconds before it first (not recorded), so its buffers, arrival
    rate and timeout decisions start from the state the serial run has there
    (a buffer lives at most ``Tmax``, a fraction of a second). Results come back
    through shared memory as raw arrays (no pickle)."""
    import mmap
    import os

    n = len(stream)
    min_requests = PARALLEL_MIN_REQUESTS if min_requests is None else min_requests
    if workers <= 1 or n < min_requests or not hasattr(os, "fork"):
        done = buffer_pass(stream, config, configurator, num_nodes, progress)
        return lambda: done
    shm = mmap.mmap(-1, n * 32)
    close = np.frombuffer(shm, np.float64, n, 0)
    execution = np.frombuffer(shm, np.int64, n, 8 * n)
    union = np.frombuffer(shm, np.int64, n, 16 * n)
    sharing = np.frombuffer(shm, np.float64, n, 24 * n)
    bounds = np.linspace(0, n, workers + 1).astype(np.int64)
    arr = stream.arrivals
    pids = []
    for w in range(workers):
        lo, hi = int(bounds[w]), int(bounds[w + 1])
        first = int(np.searchsorted(arr, arr[lo] - lead_s)) if w else lo
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                sub = RequestStream(arr[first:hi], stream.targets[first:hi],
                                    stream.set_index[first:hi], stream.sets)  # fmt: skip
                report = None
                if progress is not None and w == 0:

                    def report(i):  # noqa: E306 - progress of the first slice, scaled
                        progress(i * workers)

                bp = buffer_pass(sub, config, configurator, num_nodes, report)
                k = slice(lo - first, hi - first)
                close[lo:hi] = bp.close[k]
                execution[lo:hi] = bp.execution[k] + (w << 40)
                union[lo:hi] = bp.union[k]
                sharing[lo:hi] = bp.sharing[k]
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)

    def join() -> BufferPass:
        failed = [pid for pid in pids if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
        if failed:
            raise RuntimeError(f"{len(failed)} simulation worker(s) failed")
        return BufferPass(close.copy(), execution.copy(), union.copy(), sharing.copy(), {})

    return join


def simulate_gnn_faas(
    setup: SimulationSetup, progress=None, started: Callable[[], BufferPass] | None = None
) -> PolicyRun:
    """The gateway's buffers and pools. Under a work-conserving objective the
    buffers and pools run in one loop (:mod:`gnn_faas.traces.gateway_sim`:
    an execution's end releases the backlog); under ``cost`` the buffers do
    not depend on the pools, so their pass runs first (forked over slices of
    the stream for long traces) and the pools after."""
    if setup.buffer_config.objective != "cost":
        return _gnn_faas_coupled(setup, progress)
    cal, s = setup.calibration, setup.stream
    if started is None:
        started = start_buffer_pass(s, setup.buffer_config, setup.configurator,
                                    setup.num_nodes, setup.workers, progress)  # fmt: skip
    bp = started()
    keys, first, exec_of = np.unique(bp.execution, return_index=True, return_inverse=True)
    ready, rows = bp.close[first], bp.union[first]
    order = np.argsort(ready, kind="stable")  # executions in close order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)

    def stage(r: np.ndarray, service: np.ndarray, cold_s: float) -> PoolRun:
        return run_load_aware(
            r, service, cold_s=cold_s, keep_alive_s=cal.keep_alive_s,
            max_instances=cal.max_instances, min_instances=cal.min_instances,
            policy_cls=setup.policy_cls, end_s=setup.duration_s,
        )  # fmt: skip

    pool = _function_pools(setup, stage, ready[order], cal.exec_s(rows[order], seed=setup.seed))
    extra = {
        "buffers": int(keys.size),
        "requests_per_buffer": s.arrivals.size / max(keys.size, 1),
        "buffer_close_reasons": bp.reasons,
        "aggregated_rows_per_request": float(rows.sum() / max(s.arrivals.size, 1)),
        "workers": setup.workers,
        "objective": "cost",
    }
    return _finish(
        "gnn_faas", setup, pool, _stage_billing(cal), request_exec=rank[exec_of],
        buffer_wait=bp.close - s.arrivals, sharing=bp.sharing, extra=extra,
    )  # fmt: skip


def _stage_billing(cal: Calibration) -> tuple[tuple[float, float], ...]:
    return (
        (cal.memory_function_mb, cal.memory_vcpus),
        (cal.compute_function_mb, cal.compute_vcpus),
    )


def _gnn_faas_coupled(setup: SimulationSetup, progress=None) -> PolicyRun:
    cal, s = setup.calibration, setup.stream
    state = BufferPoolState(setup.buffer_config, setup.num_nodes)
    state.set_capacity(cal.max_instances, 0.0)  # the gateway's: the memory pool's cap

    def decide(b, st, now):  # the configurator the gateway would call
        return int(setup.configurator.decide(st))

    bc = setup.buffer_config  # the gateway's launch budget (scheduler.model_functions)
    ratio = bc.latency_slack if bc.objective == "balanced" else None
    run = run_gateway(s, cal, state, decide, seed=setup.seed, end_s=setup.duration_s,
                      progress=progress, policy_cls=setup.policy_cls,
                      launch_wait_ratio=ratio)  # fmt: skip
    members = np.bincount(run.execution, minlength=run.rows.size)
    total = np.bincount(run.execution, weights=s.sizes, minlength=run.rows.size)
    sharing = 1.0 - run.rows / np.maximum(total, 1)
    extra = {
        "buffers": int(run.rows.size),
        "requests_per_buffer": s.arrivals.size / max(run.rows.size, 1),
        "buffer_close_reasons": run.reasons,
        "aggregated_rows_per_request": float(run.rows.sum() / max(s.arrivals.size, 1)),
        "objective": setup.buffer_config.objective,
        "gate": run.gate,
        "max_requests_per_execution": int(members.max(initial=0)),
    }
    return _finish(
        "gnn_faas", setup, run.pools, _stage_billing(cal), request_exec=run.execution,
        buffer_wait=run.dispatched - s.arrivals, sharing=sharing[run.execution], extra=extra,
    )  # fmt: skip


def _pool_pass(
    setup: SimulationSetup, ready: np.ndarray, service: np.ndarray, mode: str, cold_s: float, **kw
) -> PoolRun:
    """One :func:`run_pool` pass with the calibration's keep-alive and floor."""
    cal = setup.calibration
    return run_pool(
        ready,
        service,
        mode=mode,
        cold_s=cold_s,
        keep_alive_s=cal.keep_alive_s,
        min_instances=cal.min_instances,
        end_s=setup.duration_s,
        **kw,
    )


def _per_request(setup: SimulationSetup, mode: str, cold_s: float, **kw) -> PoolRun:
    service = setup.calibration.exec_s(setup.stream.sizes, seed=setup.seed)
    return _pool_pass(setup, setup.stream.arrivals, service, mode, cold_s, **kw)


def simulate_faas_gnn(setup: SimulationSetup, progress=None) -> PolicyRun:
    """Every request its own execution at its arrival, on the gateway's
    load-aware pools (the loop ``gnn_faas`` runs, without buffers)."""
    cal = setup.calibration
    run = run_gateway(setup.stream, cal, None, seed=setup.seed, end_s=setup.duration_s,
                      policy_cls=setup.policy_cls)  # fmt: skip
    extra = {"aggregated_rows_per_request": float(setup.stream.sizes.mean())}
    return _finish("faas_gnn", setup, run.pools, _stage_billing(cal),
                   request_exec=run.execution, extra=extra)  # fmt: skip


def simulate_request_centric(setup: SimulationSetup, progress=None) -> PolicyRun:
    cal = setup.calibration
    pool = _per_request(setup, "naive", cal.cold_start_s)
    mem_mb = float(cal.request_mb(setup.stream.sizes.max()))  # sized for the largest request
    billing = ((mem_mb, cal.memory_vcpus), (cal.compute_function_mb, cal.compute_vcpus))
    extra = {"memory_function_mb": mem_mb}
    return _finish("request_centric", setup, pool, billing, extra=extra)


def simulate_dgl_serverless(setup: SimulationSetup, progress=None) -> PolicyRun:
    cal = setup.calibration
    pool = _per_request(setup, "naive", cal.cold_start_s + cal.full_fetch_s)
    mem_mb = cal.full_graph_mb
    billing = ((mem_mb, cal.memory_vcpus), (cal.compute_function_mb, cal.compute_vcpus))
    return _finish("dgl_serverless", setup, pool, billing, extra={"memory_function_mb": mem_mb})


def serverful_plan(arrivals: np.ndarray, service: np.ndarray, duration_s: float) -> np.ndarray:
    """Instances per minute: ``n_k = max(1, ⌈W_{k−1} / (0.8·60)⌉)`` (``n_0`` from ``W_0``)."""
    k = max(int(math.ceil(duration_s / SERVERFUL_INTERVAL_S)), 1)
    minute = np.clip((arrivals // SERVERFUL_INTERVAL_S).astype(np.int64), 0, k - 1)
    work = np.bincount(minute, weights=service, minlength=k)
    want = np.maximum(1, np.ceil(work / (SERVERFUL_UTILISATION * SERVERFUL_INTERVAL_S)))
    return np.concatenate([want[:1], want[:-1]]).astype(np.int64)


def simulate_serverful(setup: SimulationSetup, progress=None) -> PolicyRun:
    cal = setup.calibration
    service = cal.exec_s(setup.stream.sizes, seed=setup.seed)
    plan = serverful_plan(setup.stream.arrivals, service, setup.duration_s)
    pool = run_pool(
        setup.stream.arrivals,
        service,
        mode="fleet",
        cold_s=cal.cold_start_s + cal.full_fetch_s,
        plan=plan,
        interval_s=SERVERFUL_INTERVAL_S,
        end_s=setup.duration_s,
    )
    mb = cal.full_graph_mb + cal.compute_function_mb
    return _finish(
        "serverful", setup, pool, ((mb, cal.pair_vcpus),), serverful=True,
        extra={"instance_mb": mb, "max_planned_instances": int(plan.max())},
    )  # fmt: skip


RUNNERS: dict[str, Callable[..., PolicyRun]] = {
    "gnn_faas": simulate_gnn_faas,
    "faas_gnn": simulate_faas_gnn,
    "request_centric": simulate_request_centric,
    "dgl_serverless": simulate_dgl_serverless,
    "serverful": simulate_serverful,
}


def parse_policies(spec: str | Sequence[str]) -> list[str]:
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip() for n in names if n.strip()]
    if names == ["all"]:
        return list(POLICIES)
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise InvalidRequest(f"unknown policy {bad}; choose from {list(POLICIES)} or 'all'")
    return names


def simulate(
    setup: SimulationSetup, policies: Sequence[str], progress=None
) -> dict[str, PolicyRun]:
    out = {}
    started = None
    t_started = time.perf_counter()
    if "gnn_faas" in policies and setup.workers > 1 and setup.buffer_config.objective == "cost":
        # gnn_faas's buffer pass runs in forked workers while the others simulate
        started = start_buffer_pass(setup.stream, setup.buffer_config, setup.configurator,
                                    setup.num_nodes, setup.workers, progress)  # fmt: skip
    # gnn_faas last, so the others run while its workers do
    for name in sorted(policies, key=lambda n: n == "gnn_faas"):
        t0 = time.perf_counter()
        if name == "gnn_faas":
            run = simulate_gnn_faas(setup, progress, started)
            if started is not None:
                t0 = t_started  # its wall time includes the overlapped workers
        else:
            run = RUNNERS[name](setup, None)
        run.wall_s = time.perf_counter() - t0
        out[name] = run
    return {name: out[name] for name in policies}

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

A request answered after ``timeout_s`` is dropped; GB-s is
``Σ_instances memory/1024·(stop − spawn)``. Results go to a sink in chunks:
:func:`simulate` keeps them (:class:`PolicyRun`), :func:`summarise` reduces them
in memory bounded by the trace length (docs/design/simulator.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState
from gnn_faas.scheduler.function_pool import LoadAwarePolicy
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import Price
from gnn_faas.traces.gateway_sim import RunSink, run_gateway
from gnn_faas.traces.instance_pool import PoolSim
from gnn_faas.traces.request_stream import RequestStream
from gnn_faas.traces.summary import Instances, RunSummary
from gnn_faas.traces.timeline import Timeline
from gnn_faas.traces.update_cost import HOLDS_GRAPH, UpdatePlan, UpdateReader

POLICIES = ("gnn_faas", "faas_gnn", "request_centric", "dgl_serverless", "serverful")
SERVERFUL_UTILISATION = 0.8
SERVERFUL_INTERVAL_S = 60.0


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
    workers: int = 1  # processes for independent policies (gnn_faas.traces.parallel)
    seed: int | None = 0  # draws of measured service-time variation (None: the fit alone)
    updates: UpdatePlan | None = None  # a stream of graph updates beside the requests


@dataclass(frozen=True)
class Billing:
    """How a policy's run is billed: per function (memory MB, vCPUs);
    ``stages`` 2: memory and compute pools (an execution's stage ``k`` runs on
    function ``k``), 1: one pool whose instances hold every function (each
    execution billed once per function)."""

    functions: tuple[tuple[float, float], ...]
    stages: int
    serverful: bool = False

    def summary(self, name: str, **kw: Any) -> RunSummary:
        return RunSummary(name, self.functions, self.stages, self.serverful, **kw)


@dataclass
class PolicyRun:
    """One policy's simulated run, whole: per request, per invocation, per instance."""

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
    timeout_s: float = 30.0

    @property
    def latency(self) -> np.ndarray:
        return np.where(self.dropped, np.nan, self.done - self.arrivals)

    @property
    def instances(self) -> Instances:
        return Instances(self.inst_spawn, self.inst_stop, self.inst_mb, self.inst_vcpus,
                         self.cold_starts)  # fmt: skip

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
        inst = self.instances.after(t0)
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
            inst_spawn=inst.spawn,
            inst_stop=inst.stop,
            inst_mb=inst.mb,
            inst_vcpus=inst.vcpus,
            cold_starts=inst.cold_starts,
            inv_fn=None if self.inv_fn is None else self.inv_fn[e],
        )

    def horizon(self) -> int:
        ends = [self.arrivals.max(initial=0.0), self.inst_stop.max(initial=0.0)]
        ends.append(self.inv_end.max(initial=0.0))
        return max(int(math.ceil(max(ends))), 1)

    def _stages(self) -> list[np.ndarray]:
        """Per stage, which invocations are its (execution order)."""
        if self.inv_fn is None:
            return [np.ones(self.inv_start.size, bool)]
        return [self.inv_fn == k for k in range(len(self.billing))]

    def timeline(self, seconds: int | None = None) -> dict[str, np.ndarray]:
        """Every second: arrivals, completions, in flight, instances, allocated
        and busy GB (:class:`~gnn_faas.traces.timeline.Timeline`)."""
        tl = Timeline()
        tl.requests(self.arrivals, np.where(self.dropped, np.inf, self.done))
        for m in self._stages():
            if m.any():
                tl.invocations(self.inv_start[m], self.inv_end[m], float(self.inv_mb[m][0]) / 1024)
        return tl.columns(self.inst_spawn, self.inst_stop, self.inst_mb,
                          seconds or self.horizon())  # fmt: skip

    def peak(self) -> tuple[float, float]:
        """Peak (vCPUs, GiB) alive at once (at instance spawns)."""
        return self.instances.peak()

    def peak_instances(self) -> float:
        return self.instances.peak_count()

    def summary(self, slo_s: float, prices: dict[str, Price], duration_s: float) -> dict:
        """The figures of :meth:`RunSummary.result` for this (already cut) run."""
        stages = self._stages()
        acc = Billing(self.billing, len(stages), self.serverful).summary(
            self.name, timeout_s=self.timeout_s
        )
        try:
            acc.requests(self.arrivals, self.done, self.cold, self.sharing, self.dropped)
            for k, m in enumerate(stages):
                acc.invocations(k, self.inv_start[m], self.inv_end[m])
            return acc.result(slo_s, prices, duration_s, self.instances, self.extra, self.wall_s)
        finally:
            acc.close()


# -- the policies: each runs over the stream into a sink ---------------------------------


@dataclass(frozen=True)
class Ran:
    """What a policy's run reports beyond its sink: its instances and figures."""

    instances: Instances
    extra: dict


def _instances(lives, prewarmed, billing: Billing) -> Instances:
    """Instances of every pool (memory then compute, or the pairs), each
    pool's at its own size (pairs: every function's memory and vCPUs)."""
    spawn = np.concatenate([s for s, _ in lives])
    stop = np.concatenate([t for _, t in lives])
    if billing.stages == 1:
        mb = [float(sum(m for m, _ in billing.functions))]
        vcpus = [float(sum(v for _, v in billing.functions))]
    else:
        mb = [float(m) for m, _ in billing.functions]
        vcpus = [float(v) for _, v in billing.functions]
    sizes = [s.size for s, _ in lives]
    return Instances(spawn, stop, np.repeat(mb, sizes).astype(np.float64),
                     np.repeat(vcpus, sizes).astype(np.float64),
                     int(spawn.size) - int(sum(prewarmed)))  # fmt: skip


def billing_of(name: str, setup: SimulationSetup) -> Billing:
    cal = setup.calibration
    stages = 1 if cal.memory_share is None else 2
    if name in ("gnn_faas", "faas_gnn"):
        return Billing(
            ((cal.memory_function_mb, cal.memory_vcpus),
             (cal.compute_function_mb, cal.compute_vcpus)), stages,
        )  # fmt: skip
    if name == "serverful":
        return Billing(((cal.full_graph_mb + cal.compute_function_mb, cal.pair_vcpus),), 1, True)
    return Billing(((_memory_mb(name, setup), cal.memory_vcpus),
                    (cal.compute_function_mb, cal.compute_vcpus)), 1)  # fmt: skip


def _memory_mb(name: str, setup: SimulationSetup) -> float:
    """request_centric sizes memory for the stream's largest request;
    dgl_serverless holds the whole graph."""
    cal = setup.calibration
    if name == "dgl_serverless":
        return cal.full_graph_mb
    return float(cal.request_mb(setup.stream.size_stats()[0]))


def _reader(name: str, setup: SimulationSetup) -> UpdateReader | None:
    """Counts the update segments the policy's graph-reading instances read."""
    if setup.updates is None:
        return None
    return UpdateReader(setup.updates, holds_graph=name in HOLDS_GRAPH)


def _read(extra: dict, reader: UpdateReader | None) -> None:
    if reader is not None:
        extra["update_reads"] = reader.figures()


def run_gnn_faas(setup: SimulationSetup, sink: RunSink, progress=None) -> Ran:
    """The gateway's buffers and pools in one loop (:mod:`gnn_faas.traces.gateway_sim`);
    under ``cost`` the buffers are not told when executions end (the gate is
    off) and each pool's run ends with its last execution."""
    cal, bc = setup.calibration, setup.buffer_config
    cost = bc.objective == "cost"
    state = BufferPoolState(bc, setup.num_nodes)
    if not cost:
        state.set_capacity(cal.max_instances, 0.0)  # the gateway's: the memory pool's cap

    def decide(b, st, now):  # the configurator the gateway would call
        return int(setup.configurator.decide(st))

    # the gateway's launch budget (scheduler.model_functions)
    ratio = bc.latency_slack if bc.objective == "balanced" else None
    reader = _reader("gnn_faas", setup)
    res = run_gateway(setup.stream, cal, state, decide, seed=setup.seed, end_s=setup.duration_s,
                      progress=progress, policy_cls=setup.policy_cls, launch_wait_ratio=ratio,
                      tandem=cost, sink=sink, reader=reader)  # fmt: skip
    n = len(setup.stream)
    extra = {
        "buffers": res.executions,
        "requests_per_buffer": n / max(res.executions, 1),
        "buffer_close_reasons": res.reasons,
        "aggregated_rows_per_request": res.rows_total / max(n, 1),
        "objective": bc.objective,
    }
    if not cost:
        extra["gate"] = res.gate
        extra["max_requests_per_execution"] = res.max_members
    _read(extra, reader)
    return Ran(_instances(res.lives, res.prewarmed, billing_of("gnn_faas", setup)), extra)


def run_faas_gnn(setup: SimulationSetup, sink: RunSink, progress=None) -> Ran:
    """Every request its own execution at its arrival, on the gateway's
    load-aware pools (the loop ``gnn_faas`` runs, without buffers)."""
    reader = _reader("faas_gnn", setup)
    res = run_gateway(setup.stream, setup.calibration, None, seed=setup.seed,
                      end_s=setup.duration_s, progress=progress, policy_cls=setup.policy_cls,
                      sink=sink, reader=reader)  # fmt: skip
    n = len(setup.stream)
    extra = {"aggregated_rows_per_request": setup.stream.size_stats()[1] / max(n, 1)}
    _read(extra, reader)
    return Ran(_instances(res.lives, res.prewarmed, billing_of("faas_gnn", setup)), extra)


class _ServiceTimes:
    """Per request ``T(|U_r|)`` times its drawn measured ratio
    (:meth:`Calibration.exec_s` over the whole stream, drawn in chunks)."""

    def __init__(self, setup: SimulationSetup):
        cal = self.cal = setup.calibration
        self.sizes = setup.stream.sets.sizes
        self.ratios = cal.residual_ratios() if setup.seed is not None and cal.samples else None
        self.rng = np.random.default_rng(setup.seed)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        t = self.cal.exec_intercept_s + self.cal.exec_per_row_s * np.asarray(
            self.sizes[rows], dtype=np.float64
        )
        if self.ratios is None:
            return t
        return t * self.ratios[self.rng.integers(0, self.ratios.size, t.shape)]


def _run_pool(setup: SimulationSetup, sink: RunSink, sim: PoolSim, progress=None,
              plan: _ServerfulPlan | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Every request through ``sim`` at its arrival; the instances' lives."""
    service = _ServiceTimes(setup)
    for lo, arrivals, rows in setup.stream.chunks():
        s = service(rows)
        if plan is not None:
            plan.add(arrivals, s)
        start, end, cold = sim.feed(arrivals, s)
        sink.invocations(0, start, end)
        sink.requests(lo, end, cold, None, None)
        if progress is not None:
            progress(lo + arrivals.size)
    return sim.finish(setup.duration_s)


def _run_naive(name: str, cold_s: float):
    def run(setup: SimulationSetup, sink: RunSink, progress=None) -> Ran:
        cal = setup.calibration
        reader = _reader(name, setup)
        sim = PoolSim("naive", cold_s(cal), keep_alive_s=cal.keep_alive_s,
                      min_instances=cal.min_instances, reader=reader)  # fmt: skip
        lives = [_run_pool(setup, sink, sim, progress)]
        billing = billing_of(name, setup)
        extra = {"memory_function_mb": billing.functions[0][0]}
        _read(extra, reader)
        return Ran(_instances(lives, [cal.min_instances], billing), extra)

    return run


run_request_centric = _run_naive("request_centric", lambda cal: cal.cold_start_s)
run_dgl_serverless = _run_naive("dgl_serverless", lambda cal: cal.cold_start_s + cal.full_fetch_s)


def serverful_plan(arrivals: np.ndarray, service: np.ndarray, duration_s: float) -> np.ndarray:
    """Instances per minute: ``n_k = max(1, ⌈W_{k−1} / (0.8·60)⌉)`` (``n_0`` from ``W_0``)."""
    plan = _ServerfulPlan(duration_s)
    plan.add(arrivals, service)
    return np.asarray([plan(k) for k in range(plan.work.size)], dtype=np.int64)


class _ServerfulPlan:
    """:func:`serverful_plan` as the arrivals come: each minute's busy seconds
    ``W`` summed in arrival order (as ``np.bincount`` sums them), the plan of
    minute ``k`` asked once minute ``k − 1`` is whole."""

    def __init__(self, duration_s: float):
        self.work = np.zeros(max(int(math.ceil(duration_s / SERVERFUL_INTERVAL_S)), 1))

    def add(self, arrivals: np.ndarray, service: np.ndarray) -> None:
        k = self.work.size
        minute = np.clip((arrivals // SERVERFUL_INTERVAL_S).astype(np.int64), 0, k - 1)
        np.add.at(self.work, minute, service)

    def want(self, m: int) -> int:
        w = self.work[m]
        return int(max(1, np.ceil(w / (SERVERFUL_UTILISATION * SERVERFUL_INTERVAL_S))))

    def __call__(self, k: int) -> int:
        k = min(k, self.work.size - 1)
        return self.want(0) if k == 0 else self.want(k - 1)

    def peak(self) -> int:
        return max(self(k) for k in range(self.work.size))


def run_serverful(setup: SimulationSetup, sink: RunSink, progress=None) -> Ran:
    cal = setup.calibration
    plan = _ServerfulPlan(setup.duration_s)
    reader = _reader("serverful", setup)
    sim = PoolSim("fleet", cal.cold_start_s + cal.full_fetch_s, plan=plan,
                  interval_s=SERVERFUL_INTERVAL_S, reader=reader)  # fmt: skip
    lives = [_run_pool(setup, sink, sim, progress, plan)]
    billing = billing_of("serverful", setup)
    extra = {"instance_mb": billing.functions[0][0], "max_planned_instances": plan.peak()}
    _read(extra, reader)
    return Ran(_instances(lives, [0], billing), extra)


RUNNERS: dict[str, Callable[..., Ran]] = {
    "gnn_faas": run_gnn_faas,
    "faas_gnn": run_faas_gnn,
    "request_centric": run_request_centric,
    "dgl_serverless": run_dgl_serverless,
    "serverful": run_serverful,
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


# -- whole runs and streamed summaries ------------------------------------------------


class _Keep:
    """A sink that keeps every chunk (for :class:`PolicyRun`)."""

    def __init__(self, stream: RequestStream, stages: int):
        self.stream = stream
        self.req: list[tuple] = []
        self.inv: list[list[tuple]] = [[] for _ in range(stages)]

    def requests(self, lo, done, cold, dispatched, sharing) -> None:
        self.req.append((lo, done, cold, dispatched, sharing))

    def invocations(self, stage, start, end) -> None:
        self.inv[stage].append((start, end))


def _whole(name: str, setup: SimulationSetup, keep: _Keep, ran: Ran, billing: Billing,
           wall_s: float) -> PolicyRun:  # fmt: skip
    arr = setup.stream.arrivals
    n = arr.size
    done, cold, wait, sharing = np.zeros(n), np.zeros(n, bool), np.zeros(n), np.zeros(n)
    for lo, d, c, disp, sh in keep.req:
        hi = lo + d.size
        done[lo:hi], cold[lo:hi] = d, c
        if disp is not None:
            wait[lo:hi] = disp - arr[lo:hi]
        if sh is not None:
            sharing[lo:hi] = sh
    dropped = done - arr > setup.timeout_s
    stages = [
        [np.concatenate([c[j] for c in chunks]) if chunks else np.zeros(0) for j in (0, 1)]
        for chunks in keep.inv
    ]
    inv_fn = None
    if billing.stages == 2:
        inv_fn = np.repeat([0, 1], [s.size for s, _ in stages])
        inv_mb = np.where(inv_fn == 0, *[float(m) for m, _ in billing.functions])
    else:
        inv_mb = np.full(stages[0][0].size, float(sum(m for m, _ in billing.functions)))
    inst = ran.instances
    return PolicyRun(
        name=name, arrivals=arr, done=np.where(dropped, np.inf, done), cold=cold,
        buffer_wait=wait, sharing=sharing, dropped=dropped,
        inv_start=np.concatenate([s for s, _ in stages]),
        inv_end=np.concatenate([e for _, e in stages]), inv_mb=inv_mb,
        inst_spawn=inst.spawn, inst_stop=inst.stop, inst_mb=inst.mb, inst_vcpus=inst.vcpus,
        cold_starts=inst.cold_starts, serverful=billing.serverful, billing=billing.functions,
        wall_s=wall_s, extra=ran.extra, inv_fn=inv_fn, timeout_s=setup.timeout_s,
    )  # fmt: skip


def simulate(
    setup: SimulationSetup, policies: Sequence[str], progress=None
) -> dict[str, PolicyRun]:
    """Every policy of ``policies`` on the setup's stream, one after the
    other, each run kept whole (``progress``: gnn_faas's requests so far)."""
    if setup.stream.repeats != 1:
        raise InvalidRequest("a repeated trace is summarised as it runs (summarise), not kept")
    if len(setup.stream) == 0:
        raise InvalidRequest("the trace window holds no arrivals")
    out = {}
    for name in policies:
        t0 = time.perf_counter()
        billing = billing_of(name, setup)
        keep = _Keep(setup.stream, billing.stages)
        ran = RUNNERS[name](setup, keep, progress if name == "gnn_faas" else None)
        out[name] = _whole(name, setup, keep, ran, billing, time.perf_counter() - t0)
    return out


class _Feed:
    """A sink that hands chunks to a :class:`RunSummary` (with each chunk's
    arrivals from the stream) and, when given, to a record writer."""

    def __init__(self, stream: RequestStream, summary: RunSummary, records=None):
        self.stream, self.summary, self.records = stream, summary, records

    def requests(self, lo, done, cold, dispatched, sharing) -> None:
        arr = self.stream.arrivals_of(lo, lo + done.size)
        wait = dispatched - arr if dispatched is not None else np.zeros(arr.size)
        self.summary.requests(arr, done, cold, sharing)
        if self.records is not None:
            self.records.write(arr, done, cold, wait, sharing)

    def invocations(self, stage, start, end) -> None:
        self.summary.invocations(stage, start, end)


def summarise(
    name: str,
    setup: SimulationSetup,
    *,
    slo_s: float,
    prices: dict[str, Price],
    warmup_s: float,
    measured_s: float,
    progress: Callable[[int], None] | None = None,
    timeline: bool = False,
    records: Any = None,
    directory: str | None = None,
) -> tuple[dict, RunSummary]:
    """Run policy ``name`` and reduce its results as they come: the summary
    of the window after ``warmup_s`` (:meth:`RunSummary.result`), and the
    accumulator (its timeline, latency histogram; the caller closes it).
    ``records``: a writer of every request's record (``write(arrival, done,
    cold, buffer_wait, sharing)``)."""
    t0 = time.perf_counter()
    billing = billing_of(name, setup)
    acc = billing.summary(name, t0=warmup_s, timeout_s=setup.timeout_s, directory=directory,
                          keep_timeline=timeline, slos=(slo_s,))  # fmt: skip
    ran = RUNNERS[name](setup, _Feed(setup.stream, acc, records), progress)
    wall = time.perf_counter() - t0
    return acc.result(slo_s, prices, measured_s, ran.instances, ran.extra, wall), acc

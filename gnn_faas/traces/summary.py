"""A policy's figures from its run, fed in chunks, in memory bounded in the trace length.

The simulator's policies hand their results over as they become final:
per request (in request order) its arrival, completion, whether it waited for a
cold start, its buffer wait and its buffer's sharing degree; per invocation of
each function (in execution order) its start and end; at the end each
instance's life. :class:`RunSummary` keeps counts, the per-second timeline
(:class:`~gnn_faas.traces.timeline.Timeline`) and the values its sums and
percentiles need in :class:`~gnn_faas.traces.reduce.Spill` s, and reduces them
exactly as numpy reduces whole arrays, so a run summarised in chunks reports
the figures it reports whole.

Figures are for the window from ``t0`` on (the warm-up before it is simulated,
not measured), times shifted so ``t0`` is 0 exactly as
:meth:`~gnn_faas.traces.simulator.PolicyRun.after` shifts them:

- requests arriving at or after ``t0``; a request is dropped when its answer
  would come more than ``timeout_s`` after its arrival; latency ``done − arrival``;
- invocations starting at or after ``t0``;
- instances alive after ``t0``, their lives clipped to start there.

GB-s is ``Σ_instances memory/1024·(stop − spawn)``, busy GB-s the same sum over
invocations, dollars as :func:`gnn_faas.traces.cost.dollars` (each invocation's
duration billed per function: ``billing[k]`` is function ``k``'s memory MB and
vCPUs; with ``stages`` = 1 every execution is billed once per function, with 2
stage ``k`` is function ``k``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnn_faas.traces import reduce
from gnn_faas.traces.cost import Price
from gnn_faas.traces.reduce import Spill
from gnn_faas.traces.timeline import Timeline

CDF_EDGES_MS = np.logspace(-2, 7, 901)  # latency histogram for the CDF plot (10 µs .. 3 h)


@dataclass(frozen=True)
class Instances:
    """Every instance of a run (all pools, in launch order per pool)."""

    spawn: np.ndarray
    stop: np.ndarray
    mb: np.ndarray
    vcpus: np.ndarray
    cold_starts: int  # launched during the run (not warm before it)

    def after(self, t0: float) -> Instances:
        if t0 <= 0:
            return self
        i = self.stop > t0
        return Instances(
            np.maximum(self.spawn[i], t0) - t0,
            self.stop[i] - t0,
            self.mb[i],
            self.vcpus[i],
            int((self.spawn >= t0).sum()),
        )

    def peak(self) -> tuple[float, float]:
        """Peak (vCPUs, GiB) alive at once; stops sort before spawns at the
        same time (a replacement is not a peak)."""
        if self.spawn.size == 0:
            return 0.0, 0.0
        order = self._order()
        v = np.concatenate([self.vcpus, -self.vcpus])[order]
        g = np.concatenate([self.mb, -self.mb])[order] / 1024.0
        return float(np.cumsum(v).max()), float(np.cumsum(g).max())

    def peak_count(self) -> float:
        if self.spawn.size == 0:
            return 0.0
        kind = np.concatenate([np.ones(self.spawn.size), -np.ones(self.stop.size)])
        return float(np.cumsum(kind[self._order()]).max())

    def _order(self) -> np.ndarray:
        t = np.concatenate([self.spawn, self.stop])
        kind = np.concatenate([np.ones(self.spawn.size), -np.ones(self.stop.size)])
        return np.lexsort((kind, t))


@dataclass
class RunSummary:
    """The accumulator of the module docstring for one policy's run."""

    name: str
    billing: tuple[tuple[float, float], ...]
    stages: int
    serverful: bool = False
    t0: float = 0.0
    timeout_s: float = 30.0
    directory: str | None = None  # where spills go once they outgrow memory
    keep_timeline: bool = False
    n: int = 0
    n_dropped: int = 0
    n_cold: int = 0
    over_slo: dict[float, int] = field(default_factory=dict)
    slos: tuple[float, ...] = ()
    executions: int = 0

    def __post_init__(self) -> None:
        spill = lambda: Spill(self.directory)  # noqa: E731
        self.lat, self.lat_all, self.sharing = spill(), spill(), spill()
        self.durations = [spill() for _ in range(self.stages)]
        self.timeline = Timeline() if self.keep_timeline else None
        self.cdf = np.zeros(CDF_EDGES_MS.size - 1, np.int64)
        self.over_slo = {s: 0 for s in self.slos}

    # -- feeding -------------------------------------------------------------------
    def requests(
        self, arrivals: np.ndarray, done: np.ndarray, cold: np.ndarray,
        sharing: np.ndarray | None = None, dropped: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """A chunk of requests in request order (``done``: when the answer
        came; ``dropped``: given for a run already cut, else from the timeout)."""
        if dropped is None:
            dropped = done - arrivals > self.timeout_s
            done = np.where(dropped, np.inf, done)
        t0 = self.t0
        if t0 > 0:
            r = arrivals >= t0
            arrivals, done, dropped = arrivals[r] - t0, done[r] - t0, dropped[r]
            cold = cold[r]
            sharing = sharing[r] if sharing is not None else None
        n = int(arrivals.size)
        if n == 0:
            return
        self.n += n
        self.n_dropped += int(dropped.sum())
        self.n_cold += int(np.count_nonzero(cold))
        lat = np.where(dropped, np.nan, done - arrivals)
        ok = lat[~dropped]
        self.lat.append(ok)
        self.lat_all.append(np.where(dropped, self.timeout_s, done - arrivals))
        self.sharing.append(sharing if sharing is not None else np.zeros(n))
        for s in self.over_slo:
            self.over_slo[s] += int((ok > s).sum())
        self.cdf += np.histogram(ok * 1e3, CDF_EDGES_MS)[0]
        if self.timeline is not None:
            self.timeline.requests(arrivals, done)

    def invocations(self, stage: int, start: np.ndarray, end: np.ndarray) -> None:
        """A chunk of function ``stage``'s invocations, in execution order."""
        t0 = self.t0
        if t0 > 0:
            e = start >= t0
            start, end = start[e] - t0, end[e] - t0
        if stage == 0:
            self.executions += int(start.size)
        self.durations[stage].append(end - start)
        if self.timeline is not None:
            self.timeline.invocations(start, end, self._inv_mb(stage) / 1024.0)

    def _inv_mb(self, stage: int) -> float:
        if self.stages == 1:  # one instance holds every function
            return float(sum(mb for mb, _ in self.billing))
        return float(self.billing[stage][0])

    # -- figures -------------------------------------------------------------------
    def _segments(self, per_fn) -> list[reduce.Segment]:
        """The invocations billed per function: stage ``k`` as function ``k``,
        or (one stage) every execution once per function."""
        if self.stages == 1:
            return [(self.durations[0], per_fn(k)) for k in range(len(self.billing))]
        return [(self.durations[k], per_fn(k)) for k in range(self.stages)]

    def busy_gb_s(self) -> float:
        segs = [(d, _scale(self._inv_mb(k))) for k, d in enumerate(self.durations)]
        return reduce.pairwise_sum(segs) / 1024.0

    def dollars(self, prices: dict[str, Price], duration_s: float, peak: tuple[float, float]):
        """:func:`gnn_faas.traces.cost.dollars`, its sums over invocations exact."""
        out: dict[str, float] = {}
        count = sum(len(d) for d, _ in self._segments(lambda k: None))
        for pname, price in prices.items():
            if price.kind not in ("faas", "serverful") or (price.kind == "serverful") != (
                self.serverful
            ):
                continue
            if self.serverful:
                usd = price.serverful_cost(duration_s, *peak)
            else:
                unit = price.billing_ms / 1e3
                gb = self._segments(lambda k, u=unit: _billed(u, self.billing[k][0] / 1024.0))
                cpu = self._segments(lambda k, u=unit: _billed(u, float(self.billing[k][1])))
                memory_rate = price.gb_s + price.gib_s
                usd = reduce.pairwise_sum(gb) * memory_rate + reduce.pairwise_sum(cpu) * (
                    price.vcpu_s
                )
                usd += count * price.per_million_requests / 1e6
            out[pname] = usd
            out[f"{pname}_per_million"] = usd / max(self.n, 1) * 1e6
        return out

    def result(
        self, slo_s: float, prices: dict[str, Price], duration_s: float, instances: Instances,
        extra: dict | None = None, wall_s: float = 0.0,
    ) -> dict[str, Any]:  # fmt: skip
        """The summary :meth:`PolicyRun.summary` reports, and every request's
        latency with a dropped one at the timeout (``mean_ms_all``, ``p99_ms_all``)."""
        inst = self.instances = instances.after(self.t0)
        n, nd = self.n, self.n_dropped
        q = reduce.percentiles(self.lat, [50, 99]) * 1e3 if len(self.lat) else np.zeros(2)
        gb_s = float(np.sum((inst.stop - inst.spawn) * inst.mb) / 1024.0)
        vcpu_s = float(np.sum((inst.stop - inst.spawn) * inst.vcpus))
        over = self.over_slo.get(slo_s)
        if over is None:
            over = sum(int((b > slo_s).sum()) for b in self.lat.blocks())
        peak = inst.peak()
        out = {
            "requests": n,
            "completed": int(n - nd),
            "dropped": int(nd),
            "p50_ms": float(q[0]),
            "p99_ms": float(q[1]),
            "mean_ms": float(reduce.mean(self.lat) * 1e3) if len(self.lat) else 0.0,
            "slo_violations": int(over + nd),
            "gb_s": gb_s,
            "busy_gb_s": float(self.busy_gb_s()),
            "vcpu_s": vcpu_s,
            "gb_s_per_request": gb_s / max(n, 1),
            "cold_starts": int(inst.cold_starts),
            "cold_requests": int(self.n_cold),
            "executions": int(self.executions if self.stages == 2 else len(self.durations[0])),
            "peak_instances": int(round(inst.peak_count())),
            "mean_memory_gb": gb_s / max(duration_s, 1e-9),
            "mean_sharing_degree": float(reduce.mean(self.sharing)) if n else 0.0,
            "dollars": self.dollars(prices, duration_s, peak),
            "wall_s": wall_s,
            **(extra or {}),
        }
        out["mean_ms_all"] = float(reduce.mean(self.lat_all) * 1e3) if n else 0.0
        p99_all = reduce.percentiles(self.lat_all, 99) if n else 0.0
        out["p99_ms_all"] = float(p99_all * 1e3) if n else 0.0
        return out

    def timeline_columns(self) -> dict[str, np.ndarray]:
        """The per-second timeline (kept with ``keep_timeline``; after :meth:`result`)."""
        assert self.timeline is not None, "keep_timeline was off"
        inst = self.instances
        return self.timeline.columns(inst.spawn, inst.stop, inst.mb)

    def latency_cdf(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ms, fraction of completed requests at or under it)`` from the histogram."""
        total = max(int(self.cdf.sum()), 1)
        return CDF_EDGES_MS[1:], np.cumsum(self.cdf) / total

    def close(self) -> None:
        for s in (self.lat, self.lat_all, self.sharing, *self.durations):
            s.close()


def _scale(mb: float):
    return lambda d: d * mb


def _billed(unit: float, per_second: float):
    """Per invocation: its duration billed up to ``unit`` seconds (a tiny
    epsilon keeps 0.002 s from rounding up to 0.003 s by float error), times
    ``per_second`` (GB or vCPUs), as :meth:`Price.faas_cost` computes it."""
    return lambda d: np.ceil(d / unit - 1e-9) * unit * per_second

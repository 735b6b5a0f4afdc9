"""Instance pools for the simulator's baselines: who runs each invocation, when.

One event loop over invocations in arrival order (``ready[i]``: when the
invocation may start, ``service[i]``: its measured seconds) keeps busy
instances in a heap by the time they free up and idle ones in a heap by
launch order (the instance launched first is used first, so the rest can
reach their keep-alive and stop, as the gateway's load-aware policy does).
Three launch rules:

- ``naive`` (AWSGNN, DGL-serverless): an idle warm instance runs it, else a new
  instance is launched and the invocation waits for its cold start;
- ``load_aware`` (FaaS-GNN 4.4 without graph sharing): an idle warm instance
  runs it; else a new instance is launched (below ``max_instances``) and the
  invocation runs on whichever comes first, the busy instance freeing up
  earliest or the new one once warm (queue on a warm instance, bypassing the
  cold start); at the cap it waits for the earliest busy instance;
- ``fleet`` (serverful): the number of instances follows ``plan`` (one target
  per ``interval_s``), instances launched at a boundary are ready ``cold_s``
  later, surplus ones stop once they finish their work; an invocation waits
  for the earliest free instance (one FIFO queue). The first plan's fleet is
  warm at time 0.

Idle instances stop after ``keep_alive_s`` (not in ``fleet`` mode). Results:
per invocation start and end (and whether it waited for a cold start), per
instance spawn and stop times. The loop does a few heap operations per
invocation; everything else (timelines, costs) is vectorised afterwards.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

MODES = ("naive", "load_aware", "fleet")


@dataclass(frozen=True)
class PoolRun:
    start: np.ndarray  # per invocation
    end: np.ndarray
    cold: np.ndarray  # bool: waited for its instance's cold start
    spawn: np.ndarray  # per instance
    stop: np.ndarray
    prewarmed: int = 0  # instances warm at time 0 (not cold starts of the run)

    @property
    def cold_starts(self) -> int:
        return int(self.spawn.size) - self.prewarmed


def run_pool(
    ready: np.ndarray,
    service: np.ndarray,
    *,
    mode: str,
    cold_s: float,
    keep_alive_s: float = math.inf,
    max_instances: int = 1 << 30,
    min_instances: int = 0,
    plan: np.ndarray | None = None,
    interval_s: float = 60.0,
    end_s: float | None = None,
) -> PoolRun:
    """Run invocations (sorted by ``ready``) through a pool (see module docstring).

    ``min_instances`` are warm at time 0 (launched before the trace, as the
    live stack does); ``end_s`` is when the run ends: idle instances still
    alive then stop at ``min(idle_since + keep_alive, end)``."""
    plan_l = plan.tolist() if plan is not None else [0]
    sim = PoolSim(mode, cold_s, keep_alive_s=keep_alive_s, max_instances=max_instances,
                  min_instances=min_instances, interval_s=interval_s,
                  plan=lambda k: int(plan_l[min(k, len(plan_l) - 1)]))  # fmt: skip
    start, end, cold = sim.feed(ready, service)
    spawn, stop = sim.finish(end_s if end_s is not None else 0.0)
    return PoolRun(start, end, cold, spawn, stop, prewarmed=min_instances)


class PoolSim:
    """:func:`run_pool` fed in chunks of invocations (in ``ready`` order), so a
    long trace runs in memory bounded by its instances; ``plan(k)``: the
    fleet's target for interval ``k`` (``fleet`` mode), asked when the
    invocations reach it."""

    def __init__(
        self,
        mode: str,
        cold_s: float,
        *,
        keep_alive_s: float = math.inf,
        max_instances: int = 1 << 30,
        min_instances: int = 0,
        interval_s: float = 60.0,
        plan=None,
        reader=None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.cold_s, self.keep_alive_s = mode, cold_s, keep_alive_s
        self.reader = reader  # told of every call (instance, start): an UpdateReader
        self.max_instances, self.interval_s, self.plan = max_instances, interval_s, plan
        self.pool = _Instances(cold_s)
        for _ in range(min_instances):  # warm before the trace, as the live stack starts
            i = self.pool.launch(0.0)
            self.pool.since[i] = 0.0
            heapq.heappush(self.pool.idle, i)
        self.boundary = 0.0
        self.k = 0
        self.last_end = 0.0

    def feed(self, ready: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(start, end, cold)`` of the next invocations."""
        mode, cold_s, pool = self.mode, self.cold_s, self.pool
        busy = pool.busy  # the same heap, never rebound
        push, pop = heapq.heappush, heapq.heappop
        keep = self.keep_alive_s if mode != "fleet" else math.inf
        reader = self.reader
        n = int(ready.size)
        start = [0.0] * n
        end = [0.0] * n
        cold = [False] * n
        boundary, k = self.boundary, self.k
        for i, (a, s) in enumerate(zip(ready.tolist(), service.tolist(), strict=True)):
            if mode == "fleet":
                while a >= boundary:  # apply the plan at every boundary passed
                    # the first plan's fleet is up before the trace (always on);
                    # later scale-ups boot for cold_s
                    boot = boundary + cold_s if k else boundary
                    pool.apply_plan(self.plan(k), boundary, boot)
                    k += 1
                    boundary = k * self.interval_s
            pool.free_until(a)
            j = pool.take_idle(a, keep)
            if j >= 0:
                t0 = a
            elif mode == "naive" or (mode == "load_aware" and not busy):
                j = pool.launch(a)
                t0 = a + cold_s
                cold[i] = True
            elif mode == "load_aware" and pool.alive < self.max_instances:
                nj = pool.launch(a)
                r = a + cold_s
                if busy[0][0] < r:
                    f, j = pop(busy)
                    t0 = f
                    push(busy, (r, nj))  # the new one idles once warm
                else:
                    j, t0 = nj, r
                    cold[i] = True
            else:
                f, j = pop(busy)
                t0 = max(a, f)
            start[i] = t0
            end[i] = t0 + s
            push(busy, (t0 + s, j))
            if reader is not None:
                reader.call(j, t0)
        self.boundary, self.k = boundary, k
        if n:
            self.last_end = max(self.last_end, max(end))
        return np.asarray(start), np.asarray(end), np.asarray(cold, dtype=bool)

    def finish(self, end_s: float) -> tuple[np.ndarray, np.ndarray]:
        """``(spawn, stop)`` per instance, the run ending at ``max(end_s, last end)``."""
        horizon = max(end_s, self.last_end)
        stop = self.pool.stops(horizon, self.keep_alive_s, fleet=self.mode == "fleet")
        spawn = np.asarray(self.pool.spawn)
        return spawn, np.maximum(stop, spawn)


class _Instances:
    """A pool's instances, by launch order: launched at ``spawn``, stopped at
    ``stop`` (inf: alive), free (idle) since ``since``; ``busy`` is a heap of
    ``(free at, instance)``, ``idle`` a heap of instance ids (the earliest
    launched is taken first)."""

    def __init__(self, cold_s: float):
        self.cold_s = cold_s
        self.spawn: list[float] = []
        self.stop: list[float] = []
        self.since: list[float] = []
        self.busy: list[tuple[float, int]] = []
        self.idle: list[int] = []
        self.alive = 0

    def launch(self, t: float) -> int:
        self.spawn.append(t)
        self.stop.append(math.inf)
        self.since.append(t + self.cold_s)
        self.alive += 1
        return len(self.spawn) - 1

    def apply_plan(self, target: int, boundary: float, boot: float) -> None:
        """Scale to ``target`` instances at ``boundary``: new ones are busy
        booting until ``boot``; surplus idle instances stop first, then the
        busy ones that free up first (at ``max(boundary, free at)``)."""
        busy, idle = self.busy, self.idle
        while self.alive < target:
            heapq.heappush(busy, (boot, self.launch(boundary)))
        surplus = self.alive - target
        while surplus > 0 and idle:  # idle instances go first
            j = heapq.heappop(idle)
            self.stop[j] = boundary
            self.alive -= 1
            surplus -= 1
        if surplus > 0:  # then the busy ones that free up first
            busy.sort()
            for f, j in busy[:surplus]:
                self.stop[j] = max(boundary, f)
                self.alive -= 1
            del busy[:surplus]
            heapq.heapify(busy)

    def free_until(self, a: float) -> None:
        """Busy instances whose work ended by ``a`` become idle."""
        busy, idle, since = self.busy, self.idle, self.since
        while busy and busy[0][0] <= a:
            f, j = heapq.heappop(busy)
            since[j] = f
            heapq.heappush(idle, j)

    def take_idle(self, a: float, keep_alive_s: float) -> int:
        """An idle instance for work arriving at ``a`` (-1: none); those idle
        longer than ``keep_alive_s`` stop at the end of their keep-alive."""
        idle, since = self.idle, self.since
        while idle:
            c = heapq.heappop(idle)
            if since[c] + keep_alive_s < a:
                self.stop[c] = since[c] + keep_alive_s  # expired while idle
                self.alive -= 1
                continue
            return c
        return -1

    def stops(self, horizon: float, keep_alive_s: float, *, fleet: bool) -> np.ndarray:
        """Stop times once the run ends at ``horizon``: instances still alive
        stop at ``min(idle since + keep_alive, horizon)`` (a fleet: at the
        horizon)."""
        for f, j in self.busy:
            self.since[j] = f
            self.idle.append(j)
        for j in self.idle:
            if self.stop[j] == math.inf:
                self.stop[j] = min(self.since[j] + keep_alive_s, horizon) if not fleet else horizon
        return np.asarray(self.stop)

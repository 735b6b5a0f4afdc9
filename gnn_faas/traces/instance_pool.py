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
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    n = int(ready.size)
    ready_l = ready.tolist()
    service_l = service.tolist()
    start = [0.0] * n
    end = [0.0] * n
    cold = [False] * n
    spawn: list[float] = []
    stop: list[float] = []
    since: list[float] = []  # per instance: free (idle) since
    busy: list[tuple[float, int]] = []  # (free at, instance)
    idle: list[int] = []  # instance ids (= launch order)
    alive = 0
    push, pop = heapq.heappush, heapq.heappop

    def launch(t: float) -> int:
        nonlocal alive
        spawn.append(t)
        stop.append(math.inf)
        since.append(t + cold_s)
        alive += 1
        return len(spawn) - 1

    for _ in range(min_instances):  # warm before the trace, as the live stack starts
        i = launch(0.0)
        since[i] = 0.0
        push(idle, i)
    boundary = 0.0
    k = 0
    target = 0
    for i in range(n):
        a = ready_l[i]
        if mode == "fleet":
            while a >= boundary:  # apply the plan at every boundary passed
                target = int(plan[min(k, plan.size - 1)])
                while alive < target:
                    j = launch(boundary)
                    # the first plan's fleet is up before the trace (always on);
                    # later scale-ups boot for cold_s
                    push(busy, (boundary + cold_s if k else boundary, j))
                surplus = alive - target
                while surplus > 0 and idle:  # idle instances go first
                    j = pop(idle)
                    stop[j] = boundary
                    alive -= 1
                    surplus -= 1
                if surplus > 0:  # then the busy ones that free up first
                    busy.sort()
                    for f, j in busy[:surplus]:
                        stop[j] = max(boundary, f)
                        alive -= 1
                    busy = busy[surplus:]
                    heapq.heapify(busy)
                k += 1
                boundary = k * interval_s
        while busy and busy[0][0] <= a:
            f, j = pop(busy)
            since[j] = f
            push(idle, j)
        j = -1
        while idle:
            c = pop(idle)
            if mode != "fleet" and since[c] + keep_alive_s < a:
                stop[c] = since[c] + keep_alive_s  # expired while idle
                alive -= 1
                continue
            j = c
            break
        s = service_l[i]
        if j >= 0:
            t0 = a
        elif mode == "naive" or (mode == "load_aware" and not busy):
            j = launch(a)
            t0 = a + cold_s
            cold[i] = True
        elif mode == "load_aware" and alive < max_instances:
            nj = launch(a)
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
    horizon = max(end_s if end_s is not None else 0.0, max(end, default=0.0))
    for f, j in busy:
        since[j] = f
        idle.append(j)
    for j in idle:
        if stop[j] == math.inf:
            stop[j] = min(since[j] + keep_alive_s, horizon) if mode != "fleet" else horizon
    return PoolRun(
        np.asarray(start),
        np.asarray(end),
        np.asarray(cold, dtype=bool),
        np.asarray(spawn),
        np.maximum(np.asarray(stop), np.asarray(spawn)),
        prewarmed=min_instances,
    )

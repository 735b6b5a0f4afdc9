"""Memory and compute functions as two pools in series, as the gateway runs them.

The gateway keeps one :class:`~gnn_faas.scheduler.function_pool.FunctionPool`
per function kind, and each scales on its own load: an execution holds a
memory instance for its Aggregate calls and a compute instance for its Update
calls, so a model whose Update is quick needs fewer compute instances than
memory instances. Simulating them as memory+compute *pairs* charges a compute
instance for every memory instance (on Bitcoin OTC the live gateway kept 4
memory and 2-3 compute instances where pairs gave 4+4: GB-s 35-50% high).

An execution of ``T`` seconds (the calibration's fit) spends ``s·T`` in the
memory pool and ``(1 − s)·T`` in the compute pool, ``s`` the measured
``memory_share``; it enters the compute pool when its memory stage ends. The
memory pass does not depend on the compute pass (no back-pressure between
the pools: the gateway's are independent queues), so the two passes run one
after the other, each with its own cold start, keep-alive and cap. The
several Aggregate/Update rounds of a multi-layer model are folded into one
stage each: the busy time per pool is the same, only the interleaving differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gnn_faas.traces.instance_pool import PoolRun

# (ready, service) -> PoolRun, ``ready`` sorted: one pool's pass
StagePass = Callable[[np.ndarray, np.ndarray], PoolRun]


@dataclass(frozen=True)
class TandemRun:
    """Per execution (in the order given): its memory stage and its compute
    stage; per instance of each pool, spawn and stop."""

    memory: PoolRun
    compute: PoolRun

    @property
    def start(self) -> np.ndarray:
        return self.memory.start

    @property
    def end(self) -> np.ndarray:
        return self.compute.end

    @property
    def cold(self) -> np.ndarray:
        return self.memory.cold | self.compute.cold

    @property
    def cold_starts(self) -> int:
        return self.memory.cold_starts + self.compute.cold_starts


def run_tandem(
    ready: np.ndarray,
    service: np.ndarray,
    memory_share: float,
    memory_pass: StagePass,
    compute_pass: StagePass,
) -> TandemRun:
    """Executions (sorted by ``ready``) through the memory pool, then each, as its
    memory stage ends, through the compute pool."""
    service = np.asarray(service, dtype=np.float64)
    memory = memory_pass(ready, service * memory_share)
    order = np.argsort(memory.end, kind="stable")  # compute arrivals in time order
    c = compute_pass(memory.end[order], service[order] * (1.0 - memory_share))
    back = np.empty_like(order)
    back[order] = np.arange(order.size)
    compute = PoolRun(c.start[back], c.end[back], c.cold[back], c.spawn, c.stop, c.prewarmed)
    return TandemRun(memory, compute)

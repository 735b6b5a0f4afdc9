"""The buffer pool decides today what it decided when its golden log was
recorded: random request streams with overlapping vertex sets, bursts and
lulls, executions that end at random later times, replayed through
:class:`BufferPoolState` under every objective (the decision tree's timeouts
with global moves, the work-conserving gate balanced and latency, a vertex
cap, the fast path) against ``golden/buffer_pool.json.gz``: every closed
buffer, the next event time after every call and the pool's figures
(the gate's included) compared exactly.

The log was recorded from the pool before its hot paths were made faster for
the simulator (docs/architecture.md, "The simulator"); it is rewritten only
when a change is meant to change decisions, with

    .venv/bin/python -m tests.gateway.test_buffer_pool_golden
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from gnn_faas.gateway import work_conserving
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState, PendingRequest

GOLDEN = Path(__file__).parent / "golden" / "buffer_pool.json.gz"
NODES = 300
REQUESTS = 2500
SCENARIOS = {
    "cost_tree_moves": {"objective": "cost", "seed": 1},
    # a short p99 window: the p99 bound (P₁ over one-request executions) in play
    "balanced_gate": {"objective": "balanced", "seed": 2, "capacity": 3, "window": 200},
    "latency_gate": {"objective": "latency", "seed": 3, "capacity": 2},
    "balanced_vertex_cap": {"objective": "balanced", "seed": 4, "capacity": 4,
                            "max_vertices_per_buffer": 120, "max_requests_per_buffer": 8},
    "cost_fast_path": {"objective": "cost", "seed": 5, "fast_path_arrivals": 3.0},
}  # fmt: skip


def vertex_sets(rng: random.Random) -> list[np.ndarray]:
    """Forty neighbourhoods; a request asks for one, sometimes with strays."""
    return [np.unique(np.array([rng.randrange(NODES) for _ in range(rng.randint(3, 60))]))
            for _ in range(40)]  # fmt: skip


def decide(b, state, now) -> int:
    """A deterministic stand-in for the tree: every code, from the state."""
    return int(math.floor(state.sum() * 7.0)) % 5 - 1


def _closed(cbs) -> list:
    return [[c.buffer_id, [r.id for r in c.requests], c.union_size, c.total_vertices,
             c.sharing_degree, c.opened_at, c.closed_at, c.reason, list(c.decisions)]
            for c in cbs]  # fmt: skip


def replay(spec: dict) -> list:
    saved = work_conserving.WINDOW
    work_conserving.WINDOW = spec.get("window", saved)
    try:
        return _replay(spec)
    finally:
        work_conserving.WINDOW = saved


def _replay(spec: dict) -> list:
    rng = random.Random(spec["seed"])
    sets = vertex_sets(rng)
    keys = ("max_vertices_per_buffer", "max_requests_per_buffer", "fast_path_arrivals")
    cfg = BufferConfig(slo_s=0.3, objective=spec["objective"],
                       **{k: spec[k] for k in keys if k in spec})  # fmt: skip
    pool = BufferPoolState(cfg, NODES)
    gated = "capacity" in spec
    log: list = []
    if gated:
        log.append(["capacity", _closed(pool.set_capacity(spec["capacity"], 0.0))])
    running: list = []  # (ends at, seq, requests, dispatched at, mean wait)
    seq = 0
    t = 0.0

    def start(cbs, now) -> None:
        nonlocal seq
        for c in cbs:
            wait = sum(now - r.arrival for r in c.requests) / len(c.requests)
            duration = 0.01 + 0.002 * c.union_size * rng.uniform(0.5, 2.0)
            heapq.heappush(running, (now + duration, seq, len(c.requests), now, wait))
            seq += 1

    def record(kind, cbs, now) -> None:
        start(cbs, now)
        log.append([kind, now, _closed(cbs), pool.next_event_time()])

    for i in range(REQUESTS):
        rate = 150.0 if (i // 400) % 2 == 0 else 8.0  # bursts, then lulls
        t += rng.expovariate(rate)
        while True:
            te = running[0][0] if running and gated else math.inf
            tb = pool.next_event_time()
            if min(te, tb) > t:
                break
            if te <= tb:
                end, _, n, at, wait = heapq.heappop(running)
                queued = rng.choice([0.0, 0.0, 0.004])
                record("finished", pool.finished(end, end - at, n, wait, queued), end)
            else:
                record("advance", pool.advance(tb, decide), tb)
        u = sets[rng.randrange(len(sets))]
        if rng.random() < 0.2:
            u = np.unique(np.concatenate([u, [rng.randrange(NODES)]]))
        _, s, closed = pool.submit(PendingRequest(i, u, t, t + 0.3), t)
        record("submit", closed, t)
        log[-1].append(s)
        if i % 100 == 99:
            log.append(["stats", digest(pool.stats())])
    log.append(["flush", _closed(pool.flush(t + 1.0))])
    log.append(["final", pool.stats()])
    return log


def digest(x) -> str:
    return hashlib.sha256(json.dumps(x, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decisions_match_the_golden_log(name):
    want = json.loads(gzip.decompress(GOLDEN.read_bytes()))[name]
    got = json.loads(json.dumps(replay(SCENARIOS[name])))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"record {k} differs"


def test_scenarios_exercise_every_rule():
    """Every close reason the pool has (but shutdown, at the flush), global
    moves, the gate moving its concurrency."""
    logs = {n: replay(s) for n, s in SCENARIOS.items()}
    reasons = {r for log in logs.values() for k, v in log[-1][1]["close_reasons"].items()
               for r in [k] if v > 0}  # fmt: skip
    assert {"timeout", "decision", "fast_path", "full", "idle", "capacity", "held"} <= reasons
    assert logs["cost_tree_moves"][-1][1]["moves"] > 0
    gate = logs["balanced_gate"][-1][1]["gate"]
    assert gate["p99_bound_ms"] is not None  # P₁'s window filled
    assert logs["balanced_vertex_cap"][-1][1]["gate"]["concurrency"] not in (1.0, 4.0)


if __name__ == "__main__":  # pragma: no cover - rewrites the golden log
    GOLDEN.parent.mkdir(exist_ok=True)
    data = json.dumps({n: replay(s) for n, s in SCENARIOS.items()}).encode()
    GOLDEN.write_bytes(gzip.compress(data, mtime=0))
    print(GOLDEN, GOLDEN.stat().st_size, "bytes")

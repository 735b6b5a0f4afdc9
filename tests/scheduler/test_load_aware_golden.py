"""The load-aware policy decides today what it decided when its golden log
was recorded: random event streams (submits, instances ready, finished,
failed, removed, surplus reaped; with and without a shared launch budget;
the request-centric subclass) replayed against ``golden/load_aware.json.gz``,
every action and the policy's figures after every event compared exactly.

The log was recorded from the policy before its hot paths were made faster
for the simulator (docs/architecture.md, "The simulator"); it is rewritten
only when a change is meant to change decisions, with

    .venv/bin/python -m tests.scheduler.test_load_aware_golden
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path

import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.scheduler import function_pool
from gnn_faas.scheduler.function_pool import (
    BUSY,
    IDLE,
    LAUNCHING,
    LaunchBudget,
    LoadAwarePolicy,
    RequestCentricPolicy,
    Run,
)

GOLDEN = Path(__file__).parent / "golden" / "load_aware.json.gz"
SCENARIOS = {
    "faas_gnn_rule": {"cls": "load_aware", "ratio": None, "pools": 1, "seed": 1},
    "budget_two_pools": {"cls": "load_aware", "ratio": 0.1, "pools": 2, "seed": 2},
    # the reap rule on little evidence: reaps in a short random stream
    "budget_reaps": {"cls": "load_aware", "ratio": 1.0, "pools": 2, "seed": 5, "evidence": 10},
    "budget_alone": {"cls": "load_aware", "ratio": 2.0, "pools": 1, "seed": 3},
    "request_centric": {"cls": "request_centric", "ratio": None, "pools": 1, "seed": 4},
}
EVENTS = 3000


def _action(a) -> list:
    if isinstance(a, Run):
        return ["run", a.instance, a.item, a.wait_s]
    return ["launch", a.instance]


def _figures(p: LoadAwarePolicy) -> list:
    return [
        p.n_instances,
        p.n_requests,
        p.mean_wait_s,
        p.mean_service_s,
        [s.id for s in p.warm()],
        [[i, s.state, list(s.queue), s.current, s.since] for i, s in p.instances.items()],
        list(p.pending),
        p.surplus(),
        p.launches,
        p.steals,
        p.queued_items,
    ]


def replay(spec: dict) -> list:
    """The scenario's events against fresh policies; the log of what they did."""
    saved = function_pool.MIN_EVIDENCE
    function_pool.MIN_EVIDENCE = spec.get("evidence", saved)
    try:
        return _replay(spec)
    finally:
        function_pool.MIN_EVIDENCE = saved


def _replay(spec: dict) -> list:
    rng = random.Random(spec["seed"])
    clock = FakeClock(0.0)
    cls = RequestCentricPolicy if spec["cls"] == "request_centric" else LoadAwarePolicy
    budget = LaunchBudget(spec["ratio"]) if spec["ratio"] is not None else None
    pools = [
        cls(4, clock=clock, name=f"p{k}", budget=budget, memory_mb=256.0 * (k + 1))
        for k in range(spec["pools"])
    ]
    log: list = []
    item = 0
    for k in range(EVENTS):
        clock.advance(rng.expovariate(40.0))
        p = rng.choice(pools)
        by_state = {st: [i for i, s in p.instances.items() if s.state == st]
                    for st in (LAUNCHING, IDLE, BUSY)}  # fmt: skip
        busy = k % 1500 < 300  # bursts (queues build, pools launch), then lulls
        r = rng.random()
        if r < (0.55 if busy else 0.35):
            item += 1
            event, out = ["submit", item], p.submit(item)
        elif r < 0.90 and by_state[BUSY]:
            inst = rng.choice(by_state[BUSY])
            event, out = ["finished", inst], p.finished(inst)
        elif r < 0.95 and by_state[LAUNCHING]:
            inst = rng.choice(by_state[LAUNCHING])
            event, out = ["ready", inst], p.ready(inst)
        elif r < 0.998:
            s = p.surplus()
            event, out = ["reap", s], [p.remove(s)] if s is not None else []
        elif r < 0.999 and p.instances:
            inst = rng.choice(sorted(p.instances))
            event, out = ["remove", inst], [p.remove(inst)]
        elif p.instances:
            inst = rng.choice(sorted(p.instances))
            actions, current = p.failed(inst)
            event, out = ["failed", inst, current], actions
        else:
            event, out = ["launch"], [p.launch()]
        actions = [_action(a) if not isinstance(a, bool) else a for a in out]
        log.append([clock.now(), p.name, event, actions, digest(_figures(p))])
    return log


def digest(figures: list) -> str:
    """The policy's figures after an event, as a short digest (the log stays small)."""
    return hashlib.sha256(json.dumps(figures).encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_decisions_match_the_golden_log(name):
    want = json.loads(gzip.decompress(GOLDEN.read_bytes()))[name]
    got = json.loads(json.dumps(replay(SCENARIOS[name])))
    assert len(got) == len(want) == EVENTS
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"event {k} differs"


def test_scenarios_exercise_every_decision():
    """The streams reach the rules the log pins down: launches, queueing on a
    warm instance, steals, budget reaps, failures."""
    logs = {n: replay(s) for n, s in SCENARIOS.items()}
    kinds = {n: {e[2][0] for e in log} for n, log in logs.items()}
    assert all({"submit", "finished", "ready", "failed"} <= k for k in kinds.values())
    assert sum(e[2][0] == "reap" and e[3] == [True] for e in logs["budget_reaps"]) >= 3
    runs = [a for log in logs.values() for e in log for a in e[3] if isinstance(a, list)]
    assert sum(a[0] == "launch" for a in runs) > 50
    assert sum(a[0] == "run" and a[3] > 0 for a in runs) > 500  # waited in a queue


if __name__ == "__main__":  # pragma: no cover - rewrites the golden log
    GOLDEN.parent.mkdir(exist_ok=True)
    data = json.dumps({n: replay(s) for n, s in SCENARIOS.items()}).encode()
    GOLDEN.write_bytes(gzip.compress(data, mtime=0))
    print(GOLDEN, GOLDEN.stat().st_size, "bytes")

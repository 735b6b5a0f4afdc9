"""The work-conserving gate on a fake clock: a lone request on an idle pool is
dispatched at once, requests arriving while every instance is busy join the
next free instance's batch, ``cost`` keeps today's decisions, and ``balanced``
keeps the mean latency within its bound where the answer is known."""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.config import ModelBufferSettings, ServingConfig, from_dict
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer import PendingRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState, MultiBufferPool
from gnn_faas.gateway.timeout_configurator import FixedTimeoutConfigurator
from gnn_faas.gateway.work_conserving import Objective, WorkConservingGate


def make_pool(objective="balanced", capacity=1, **kw):
    clock = FakeClock(10.0)
    closed = []
    config = BufferConfig(objective=objective, fast_path_arrivals=0.0, **kw)
    pool = MultiBufferPool(
        config, 100, clock, FixedTimeoutConfigurator(1), closed.append, max_concurrency=capacity
    )
    return pool, clock, closed


def vs(*ids):
    return np.asarray(ids, dtype=np.int64)


@pytest.mark.parametrize("objective", ["balanced", "latency"])
def test_lone_request_on_an_idle_pool_is_dispatched_at_once(objective):
    pool, clock, closed = make_pool(objective)
    pool.submit("a", vs(1, 2, 3))
    assert len(closed) == 1
    assert closed[0].closed_at == clock.now()  # no wait at all
    assert closed[0].reason == "idle"
    assert [r.id for r in closed[0].requests] == ["a"]


def test_requests_arriving_while_busy_are_merged_into_the_next_batch():
    pool, clock, closed = make_pool("balanced")
    pool.submit("a", vs(1, 2, 3))  # takes the only instance
    assert len(closed) == 1
    for i, rid in enumerate(["b", "c", "d"]):
        clock.advance(0.002)
        pool.submit(rid, vs(2, 3, 10 + i))
    assert len(closed) == 1  # all busy: they wait, in one buffer
    assert pool.stats["open_buffers"] == 1
    clock.advance(0.004)
    pool.finished(0.010, 1, 0.0)  # the instance frees: the backlog runs as one batch
    assert len(closed) == 2
    batch = closed[1]
    assert batch.reason == "capacity"
    assert sorted(r.id for r in batch.requests) == ["b", "c", "d"]
    assert batch.sharing_degree > 0
    assert batch.closed_at == clock.now()


def test_backlog_never_waits_past_tmax():
    pool, clock, closed = make_pool("balanced")
    pool.submit("a", vs(1))
    clock.advance(0.001)
    pool.submit("b", vs(2))  # held: the execution of "a" never reports back
    clock.advance(BufferConfig().tmax - 0.0005)
    pool.tick()
    assert len(closed) == 1  # still held
    clock.advance(0.001)
    pool.tick()
    assert len(closed) == 2 and closed[1].reason == "held"


def test_latency_objective_runs_up_to_the_pool_size_at_once_then_holds():
    pool, clock, closed = make_pool("latency", capacity=2)
    pool.submit("a", vs(1))
    pool.submit("b", vs(50))
    assert len(closed) == 2  # two instances, two executions
    pool.submit("c", vs(60))
    pool.submit("d", vs(61))
    assert len(closed) == 2  # both busy: the backlog waits, merged
    clock.advance(0.01)
    pool.finished(0.01, 1, 0.0)
    assert len(closed) == 3 and closed[2].reason == "capacity"
    assert sorted(r.id for r in closed[2].requests) == ["c", "d"]


def drive(state: BufferPoolState, arrivals, sets, decide):
    """Requests through a state without a capacity (the gate stays off)."""
    out = []
    for i, (a, u) in enumerate(zip(arrivals, sets)):
        while state.next_event_time() <= a:
            out += state.advance(state.next_event_time(), decide)
        _, _, closed = state.submit(PendingRequest(i, u, a, a + 0.3), a)
        out += closed
    while state.next_event_time() < np.inf:
        out += state.advance(state.next_event_time(), decide)
    return [(c.buffer_id, c.closed_at, c.reason, tuple(r.id for r in c.requests)) for c in out]


def test_cost_objective_reproduces_todays_decisions():
    """``cost`` with a known capacity closes exactly the buffers, at exactly the
    times and for the reasons, that the pool without a gate does."""
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(0.01, 400))
    sets = [np.unique(rng.integers(0, 200, 8)) for _ in arrivals]

    def decide(b, s, now):  # a state-dependent decision, as a tree's
        return -1 if s[1] > 0.3 else (2 if s[2] < 3 else 0)

    today = drive(BufferPoolState(BufferConfig(), 200), arrivals, sets, decide)
    cost = BufferPoolState(BufferConfig(objective="cost"), 200)
    cost.set_capacity(1, 0.0)
    assert not cost.gate.active
    assert drive(cost, arrivals, sets, decide) == today
    assert len({c[2] for c in today}) > 1  # the decisions did vary


def simulate_balanced(slack: float, rate: float, n: int = 6000, seed: int = 0):
    """Poisson arrivals of disjoint requests through the gate; executions take
    ``a + b·k`` seconds for ``k`` requests on instances that scale out without
    a cold start when a batch finds all busy (the load-aware pool's launch, at
    no delay), and scale in after a keep-alive. Without sharing each request
    takes exactly ``a + b``: the no-sharing mean is known."""
    a, b = 0.020, 0.002
    cfg = BufferConfig(objective="balanced", latency_slack=slack, fast_path_arrivals=0.0)
    state = BufferPoolState(cfg, 10 * n)
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))
    arrival_of: dict[int, float] = {}
    done: dict[int, float] = {}
    running: list = []  # (end, seq, request ids, duration, mean wait)
    busy_instances = [0]
    instances = [1]
    seq = [0]

    def dispatch(closed, now):
        for cb in closed:
            ids = [r.id for r in cb.requests]
            busy_instances[0] += 1  # instances scale out at once
            instances[0] = max(instances[0], busy_instances[0])
            d = a + b * len(ids)
            wait = float(np.mean([now - arrival_of[i] for i in ids]))
            heapq.heappush(running, (now + d, seq[0], ids, d, wait))
            seq[0] += 1

    def finish_until(t):
        while True:
            nxt = min(running[0][0] if running else np.inf, state.next_event_time())
            if nxt > t or nxt == np.inf:
                return
            if running and running[0][0] <= state.next_event_time():
                end, _, ids, d, wait = heapq.heappop(running)
                busy_instances[0] -= 1
                for i in ids:
                    done[i] = end
                dispatch(state.finished(end, d, len(ids), wait), end)
            else:
                now = state.next_event_time()
                dispatch(state.advance(now, lambda *x: 0), now)

    state.set_capacity(8, 0.0)
    for i, t in enumerate(arrivals):
        finish_until(t)
        arrival_of[i] = t
        _, _, closed = state.submit(PendingRequest(i, np.array([i]), t, t + 0.3), t)
        dispatch(closed, t)
    finish_until(np.inf)
    warm = n // 5  # the controller settles first
    lat = np.array([done[i] - arrival_of[i] for i in range(warm, n)])
    return float(lat.mean()), a + b, seq[0], instances[0]


@pytest.mark.parametrize("slack", [0.1, 0.3])
def test_balanced_respects_its_mean_latency_bound(slack):
    mean, no_sharing_mean, executions, _ = simulate_balanced(slack, rate=100.0)
    assert mean <= (1 + slack) * no_sharing_mean * 1.02  # within the bound (2%: EWMA noise)
    assert executions < 6000  # and it still shared work


def test_balanced_shares_more_with_more_slack():
    tight = simulate_balanced(0.05, rate=100.0)
    loose = simulate_balanced(0.5, rate=100.0)
    assert loose[2] < tight[2]  # fewer executions
    assert loose[0] > tight[0]  # for more latency


def test_objective_config_per_model_and_errors():
    cfg = from_dict(
        ServingConfig,
        {
            "buffers": {"objective": "cost"},
            "models": [{"name": "m", "buffers": {"objective": "latency"}}],
        },
    )
    m = cfg.models[0]
    assert BufferConfig.from_settings(cfg.buffers, m.slo_s, m.buffers).objective == "latency"
    assert BufferConfig.from_settings(cfg.buffers, 0.3).objective == "cost"
    assert (
        BufferConfig.from_settings(
            cfg.buffers, 0.3, ModelBufferSettings(latency_slack=0.5)
        ).latency_slack
        == 0.5
    )
    with pytest.raises(InvalidRequest, match="objective"):
        from_dict(ServingConfig, {"models": [{"name": "m", "buffers": {"objective": "fast"}}]})
    with pytest.raises(ValueError):
        Objective("balanced", -1.0)
    assert dataclasses.replace(BufferConfig(), objective="latency").objective == "latency"


def test_lone_dispatch_shortcut_changes_nothing(monkeypatch):
    """A request dispatched alone skips the sharing index; the run is the same
    as through the router and a buffer (only quicker)."""
    fast = simulate_balanced(0.3, rate=150.0, n=1500)
    monkeypatch.setattr(BufferPoolState, "_dispatch_alone", lambda self, now: False)
    slow = simulate_balanced(0.3, rate=150.0, n=1500)
    assert fast == slow
    assert fast[2] < 1500  # and the run did share


def test_a_held_buffer_has_no_deadline_in_its_snapshot():
    """While every instance is busy the gate holds the buffer with no deadline of
    its own: the snapshot (what /v1/status shows) says None, and stays JSON."""
    import json

    pool, clock, closed = make_pool("balanced")
    pool.submit("a", vs(1, 2, 3))  # takes the only instance
    clock.advance(0.002)
    pool.submit("b", vs(2, 3, 4))  # held until the instance frees
    (snap,) = pool.snapshot()
    assert snap["requests"] == 1 and snap["deadline_in_s"] is None
    assert snap["closes_in_s"] > 0
    json.dumps(pool.snapshot(), allow_nan=False)  # raises on inf


def _feed(gate: WorkConservingGate, executions: int, held_every: int, held_wait_s: float) -> None:
    """One-request executions of 20 ms (so ``L₁`` = ``P₁`` = 20 ms); every
    ``held_every``-th execution instead merges 2 requests that waited
    ``held_wait_s`` in their buffer (taking the same 20 ms)."""
    for e in range(executions):
        gate.dispatched()
        if e % held_every == 0:
            gate.finished(0.020, 2, held_wait_s)
        else:
            gate.finished(0.020, 1, 0.0)


def test_balanced_raises_concurrency_when_the_tail_breaks_its_p99_bound():
    # 2 of every 51 requests wait 30 ms: mean 21.2 ms, within (1 + 0.1)·20 = 22 ms,
    # but the p99 (50 ms) is far above (1 + 0.1)·P₁ = 22 ms: C must rise to C_max
    tail = WorkConservingGate(Objective("balanced", 0.1), 0.020)
    tail.set_max_concurrency(4)
    _feed(tail, 6000, held_every=50, held_wait_s=0.030)
    assert tail.latency_s < tail.bound_s
    assert tail.single_p99_s == pytest.approx(0.020)
    assert tail.p99_s == pytest.approx(0.050)
    assert tail.concurrency == 4.0
    # the same with a 1 ms wait: both bounds hold, so C falls and requests share
    short = WorkConservingGate(Objective("balanced", 0.1), 0.020)
    short.set_max_concurrency(4)
    short.concurrency = 4.0
    _feed(short, 6000, held_every=50, held_wait_s=0.001)
    assert short.p99_s < 1.1 * short.single_p99_s
    assert short.concurrency == 1.0
    d = short.as_dict()
    assert d["p99_bound_ms"] == pytest.approx(22.0)
    unknown = WorkConservingGate(Objective("balanced", 0.1), 0.020).as_dict()
    assert unknown["p99_bound_ms"] is None  # strict JSON: no Infinity before P₁ is known


def test_pool_queue_waits_count_against_the_bound_not_in_it():
    """An execution of 30 ms that waited 10 ms of it in the function pools'
    queues: ``L₁`` and ``P₁`` are the 20 ms of work, so the 30 ms latency is
    over the bound and C rises (the pools' waits take the slack first); fitted
    on the whole 30 ms, as before, the bound would grow with the queues and C
    fall, holding requests on top of the pools' waits."""
    gates = {}
    for queued in (0.010, 0.0):
        gate = WorkConservingGate(Objective("balanced", 0.1), 0.020)
        gate.set_max_concurrency(4)
        gate.concurrency = 2.0
        for _ in range(3000):
            gate.dispatched()
            gate.finished(0.030, 1, 0.0, queued)
        gates[queued] = gate
    waited, whole = gates[0.010], gates[0.0]
    assert waited.single_s == pytest.approx(0.020) and waited.single_p99_s == pytest.approx(0.020)
    assert whole.single_s == pytest.approx(0.030)
    assert waited.latency_s == pytest.approx(0.030) == whole.latency_s
    assert waited.concurrency == 4.0 and whole.concurrency == 1.0


def test_buffer_pool_passes_the_pools_waits_to_the_gate():
    fits = []
    for queued in (0.010, 0.0):
        pool, clock, closed = make_pool("balanced", capacity=2, exec_estimate_s=0.020)
        pool.submit("a", vs(1, 2, 3))
        assert len(closed) == 1
        pool.finished(0.030, 1, 0.0, queued)
        fits.append(pool.stats["gate"]["single_execution_ms"])
    # the 20 ms prior stays at the 20 ms of work; the whole 30 ms moves it
    assert fits[0] == pytest.approx(20.0) and fits[1] > 20.1


@pytest.mark.parametrize("n", [1, 2, 3, 99, 100, 101, 1999, 2000])
def test_percentile99_is_numpys(n):
    """The gate's p99 is ``np.percentile(x, 99)`` to the bit, ties and all."""
    from gnn_faas.gateway.work_conserving import percentile99

    rng = np.random.default_rng(n)
    for _ in range(20):
        x = rng.exponential(0.03, n)
        x[rng.random(n) < 0.3] = 0.0215
        assert percentile99(x) == float(np.percentile(x, 99))

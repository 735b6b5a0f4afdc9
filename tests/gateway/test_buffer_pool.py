"""MultiBufferPool on a fake clock: deadlines, close reasons, Tmax, decisions,
global moves, and every request delivered exactly once."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

import numpy as np
import pytest

from gnn_faas.clock import FakeClock, RealClock
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, ClosedBuffer, MultiBufferPool
from gnn_faas.gateway.timeout_configurator import FixedTimeoutConfigurator
from gnn_faas.gateway.timeout_history import TimeoutHistory, trace_request_stream
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.traces import twitter

EPS = 1e-9


@pytest.fixture(scope="module")
def bitcoin(tmp_path_factory):
    """Real arrivals (busiest Twitter window at 60 req/s, 8 s) and the 2-hop
    sets of Bitcoin OTC's real request order."""
    store = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    graph = open_graph(store, "bitcoin-otc")
    arrivals = twitter.arrivals(60, 8, seed=0)
    return graph.num_nodes, arrivals, trace_request_stream(graph, arrivals, hops=2)


class Recorder:
    def __init__(self):
        self.closed: list[ClosedBuffer] = []

    def __call__(self, cb: ClosedBuffer) -> None:
        self.closed.append(cb)


def make_pool(config=None, decision=0, num_nodes=100, history=None, fast_path=False):
    """A pool on a fake clock; the low-load fast path is off unless asked for:
    these tests drive buffers with a few sparse requests on purpose."""
    clock = FakeClock(100.0)
    rec = Recorder()
    config = config or BufferConfig()
    if not fast_path:
        config = dataclasses.replace(config, fast_path_arrivals=0.0)
    pool = MultiBufferPool(
        config,
        num_nodes,
        clock,
        FixedTimeoutConfigurator(decision),
        rec,
        history=history,
    )
    return pool, clock, rec


def run_events(pool: MultiBufferPool, clock: FakeClock, until: float) -> None:
    """Tick at every event time up to ``until`` (a discrete-event loop)."""
    while (t := pool.next_event_time()) <= until:
        clock.set(t)
        pool.tick()
    clock.set(until)


def test_buffer_closes_at_t0_with_reason_timeout():
    cfg = BufferConfig()
    pool, clock, rec = make_pool(cfg)
    pool.submit("a", np.array([1, 2, 3]))
    clock.advance(0.01)
    pool.submit("b", np.array([2, 3, 4]))
    assert pool.tick() == [] and rec.closed == []
    run_events(pool, clock, 100.0 + cfg.t0)
    (cb,) = rec.closed
    assert cb.reason == "timeout" and cb.closed_at == pytest.approx(100.0 + cfg.t0)
    assert [r.id for r in cb.requests] == ["a", "b"]
    assert cb.union_size == 4 and cb.total_vertices == 6
    assert cb.sharing_degree == pytest.approx(1 - 4 / 6)
    assert cb.decisions == (0,)  # one decision point at τ = T0 (keep)


def test_extensions_are_capped_at_tmax_and_recorded():
    cfg = BufferConfig()
    history = TimeoutHistory(capacity=16)
    pool, clock, rec = make_pool(cfg, decision=3, history=history)
    pool.submit("a", np.array([1]))
    run_events(pool, clock, 101.0)
    (cb,) = rec.closed
    assert cb.reason == "timeout"
    assert cb.closed_at - cb.opened_at == pytest.approx(cfg.tmax)
    # decision points at τ, 2τ, ... before Tmax, each extending (then capped)
    assert len(cb.decisions) >= 2 and set(cb.decisions) == {3}
    h = history.arrays()
    assert h["decision"].tolist() == list(cb.decisions)
    assert np.all(np.isfinite(h["outcome"]))  # filled at close
    assert h["state"][0].tolist()[2] == 1.0  # N = 1


def test_decision_close_now():
    pool, clock, rec = make_pool(BufferConfig(gamma=0.2), decision=-1)
    pool.submit("a", np.array([1]))
    run_events(pool, clock, 101.0)
    (cb,) = rec.closed
    assert cb.reason == "decision"
    assert cb.closed_at - cb.opened_at == pytest.approx(pool.config.tau)


def test_full_buffer_closes_in_submit():
    cfg = BufferConfig(max_requests_per_buffer=3)
    pool, clock, rec = make_pool(cfg)
    for i in range(3):
        pool.submit(f"r{i}", np.array([1, 2]))
        assert len(rec.closed) == (1 if i == 2 else 0)
    assert rec.closed[0].reason == "full" and rec.closed[0].num_requests == 3
    cfg_v = BufferConfig(max_vertices_per_buffer=5)
    pool, clock, rec = make_pool(cfg_v)
    pool.submit("a", np.array([1, 2, 3]))
    pool.submit("b", np.array([3, 4, 5]))  # union reaches 5 vertices
    assert [c.reason for c in rec.closed] == ["full"]


def test_request_slo_budget_closes_early_with_reason_deadline():
    cfg = BufferConfig(delta=0.9, exec_estimate_s=0.05)
    pool, clock, rec = make_pool(cfg, decision=3)
    pool.submit("long", np.array([1, 2]))
    clock.advance(0.01)
    pool.submit("short", np.array([2, 3]), slo_s=0.1)
    run_events(pool, clock, 101.0)
    (cb,) = rec.closed
    assert cb.reason == "deadline"
    for r in cb.requests:
        assert cb.closed_at + cfg.exec_estimate_s <= r.deadline + EPS
    assert cb.closed_at == pytest.approx(100.01 + 0.1 - 0.05)
    # a request whose SLO is already impossible closes at once
    pool.submit("hopeless", np.array([7]), slo_s=0.01)
    assert rec.closed[-1].reason == "deadline" and rec.closed[-1].requests[0].id == "hopeless"


def test_every_request_delivered_exactly_once_with_moves(bitcoin):
    n, arrivals, sets = bitcoin
    # open_below makes requests start new buffers, so the global optimiser has
    # something to merge.
    cfg = BufferConfig(open_below=0.3, delta=0.5)
    pool, clock, rec = make_pool(cfg, decision=1, num_nodes=n)
    t0 = clock.now()
    for i, (a, u) in enumerate(zip(arrivals, sets, strict=True)):
        run_events(pool, clock, t0 + a)
        pool.submit(str(i), u, payload=i)
    run_events(pool, clock, t0 + arrivals[-1] + 0.1)
    pool.submit("last", sets[0])
    pool.flush()
    ids = Counter(r.id for cb in rec.closed for r in cb.requests)
    assert len(ids) == arrivals.size + 1 and set(ids.values()) == {1}
    stats = pool.stats
    assert stats["moves"] > 0
    assert stats["closed_requests"] == arrivals.size + 1 == stats["submitted"]
    assert stats["waiting"] == 0 and stats["open_buffers"] == 0
    assert rec.closed[-1].reason == "shutdown"
    for cb in rec.closed:
        assert cb.closed_at - cb.opened_at <= cfg.tmax + EPS
        assert cb.union_size <= cb.total_vertices
        for r in cb.requests:  # nobody waits past its SLO budget
            assert cb.closed_at + cfg.exec_estimate_s <= r.deadline + EPS
    assert stats["mean_sharing_degree"] > 0.2


def test_snapshot_and_errors():
    pool, clock, rec = make_pool()
    bid = pool.submit("a", np.array([3, 1, 2]))
    clock.advance(0.01)
    (snap,) = pool.snapshot()
    assert snap["buffer_id"] == bid and snap["requests"] == 1 and snap["vertices"] == 3
    assert snap["age_s"] == pytest.approx(0.01)
    assert snap["closes_in_s"] == pytest.approx(pool.config.t0 - 0.01)
    with pytest.raises(InvalidRequest, match="already waiting"):
        pool.submit("a", np.array([4]))
    with pytest.raises(InvalidRequest):
        pool.submit("b", np.array([-1]))
    with pytest.raises(InvalidRequest):
        pool.submit("c", np.array([1]), slo_s=0)
    # a vertex beyond the pool's tables (a graph that gained vertices): they grow
    before = pool.num_nodes
    pool.submit("d", np.array([1, before + 5]))
    assert pool.num_nodes > before + 5
    pool.stop()  # never started: flushes
    assert [c.reason for c in rec.closed] == ["shutdown"]


def test_failing_callback_does_not_block_other_buffers():
    seen = []

    def on_close(cb):
        seen.append(cb.buffer_id)
        if len(seen) == 1:
            raise RuntimeError("downstream failed")

    pool = MultiBufferPool(
        BufferConfig(max_requests_per_buffer=1),
        10,
        FakeClock(),
        FixedTimeoutConfigurator(),
        on_close,
    )
    pool.submit("a", np.array([1]))
    pool.submit("b", np.array([1]))
    assert len(seen) == 2 and pool.stats["callback_errors"] == 1


def test_background_thread_closes_buffers_with_a_real_clock():
    done = threading.Event()
    closed = []

    def on_close(cb):
        closed.append(cb)
        done.set()

    pool = MultiBufferPool(
        BufferConfig(slo_s=0.1, fast_path_arrivals=0.0),
        10,
        RealClock(),
        FixedTimeoutConfigurator(),
        on_close,
    )
    pool.start()
    try:
        pool.submit("a", np.array([1, 2]))
        assert done.wait(5.0)
    finally:
        pool.stop()
    assert closed[0].reason == "timeout" and len(closed) == 1


@pytest.mark.parametrize("rate", [1.0, 5.0])
def test_fast_path_closes_a_lone_request_at_once_at_low_load(rate):
    pool, clock, rec = make_pool(decision=3, fast_path=True)  # the tree would extend
    for i in range(5):
        clock.advance(1.0 / rate)
        pool.submit(f"r{i}", np.array([i, 50 + i]))
        assert [c.reason for c in rec.closed][-1] == "fast_path"
        assert rec.closed[-1].closed_at == clock.now()  # no wait at all
    assert len(rec.closed) == 5 and pool.stats["close_reasons"] == {"fast_path": 5}


def test_fast_path_leaves_buffers_to_the_tree_when_arrivals_are_expected():
    cfg = BufferConfig()  # Tmax = 150 ms: Q must reach 1 / 0.15 s ≈ 6.7 req/s
    pool, clock, rec = make_pool(cfg, decision=0, fast_path=True)
    for i in range(60):  # 40 req/s of overlapping requests for 1.5 s
        clock.advance(0.025)
        pool.submit(f"r{i}", np.array([1, 2, 3]))
        run_events(pool, clock, clock.now())
    late = [c for c in rec.closed if min(int(r.id[1:]) for r in c.requests) >= 20]
    # once the rate estimate has built up (time constant 1 s), buffers wait and share
    assert late and all(c.reason != "fast_path" for c in late)
    assert min(c.num_requests for c in late) > 1


def test_fast_path_closes_a_lone_buffer_once_the_rate_falls():
    cfg = BufferConfig(gamma=0.5, delta=0.5)  # T0 = Tmax = 150 ms, τ = 30 ms
    pool, clock, rec = make_pool(cfg, decision=0, fast_path=True)
    for i in range(10):  # a burst: the rate estimate builds up
        pool.submit(f"b{i}", np.array([1, 2, 3]))
    run_events(pool, clock, clock.now())
    # the first six went alone (Q = 1..6 req/s: Q·Tmax < 1); from Q = 7 buffers wait
    assert [c.reason for c in rec.closed] == ["fast_path"] * 6
    assert pool.stats["waiting"] == 4
    clock.advance(2.0)  # a quiet spell: Q decays
    run_events(pool, clock, clock.now() + 0.2)  # drain the burst's buffer
    n = len(rec.closed)
    pool.submit("late", np.array([9]))
    # Q = 10·e^-2 + 1 ≈ 2.35 req/s: 2.35 · 0.15 < 1, so the lone request goes at once
    assert len(rec.closed) == n + 1 and rec.closed[-1].reason == "fast_path"


class CountingCondition(threading.Condition):
    """A condition that counts its ``notify_all`` calls and sets ``waiting``
    when a thread (the pool's ticker) goes to sleep on it."""

    def __init__(self):
        super().__init__(threading.Lock())
        self.notified = 0
        self.waiting = threading.Event()

    def notify_all(self):
        self.notified += 1
        super().notify_all()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def _sleeping_pool(config: BufferConfig, on_close) -> tuple[MultiBufferPool, CountingCondition]:
    """A started pool (real clock) whose ticker has gone to sleep, idle."""
    pool = MultiBufferPool(config, 10, RealClock(), FixedTimeoutConfigurator(), on_close,
                           max_wait_s=30.0)  # fmt: skip
    pool._cond = cond = CountingCondition()
    pool.start()
    assert cond.waiting.wait(10.0), "the ticker never went to sleep"
    with cond:  # it holds the lock until its wait() releases it
        assert pool._ticker_wakes_at is not None
    return pool, cond


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_ticker_is_woken_only_for_an_earlier_event(fast_path):
    """A request dispatched at once leaves the sleeping ticker alone (no thread
    wake-up); one that opens a buffer due before the ticker's own wake-up wakes
    it, and the buffer closes on time."""
    done = threading.Event()
    closed = []
    config = (
        BufferConfig(slo_s=0.2) if fast_path else BufferConfig(slo_s=0.2, fast_path_arrivals=0.0)
    )
    pool, cond = _sleeping_pool(config, lambda cb: (closed.append(cb), done.set()))
    try:
        pool.submit("a", np.array([1, 2]))
        assert done.wait(10.0)
        if fast_path:
            assert closed[0].reason == "fast_path" and cond.notified == 0
        else:
            assert closed[0].reason == "timeout" and cond.notified == 1
    finally:
        pool.stop()

"""Load-aware queueing (FaaS-GNN 4.4): launch only when no instance is idle and
n_req > n_instances; idle instances steal from the tail of the longest queue;
FunctionPool retries work of a failing instance elsewhere."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import wait
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_faas.clock import FakeClock
from gnn_faas.errors import InvalidRequest, Unavailable
from gnn_faas.scheduler.function_pool import (
    BUSY,
    IDLE,
    MIN_EVIDENCE,
    FunctionPool,
    Launch,
    LaunchBudget,
    LoadAwarePolicy,
    RequestCentricPolicy,
    Run,
    _OneFewer,
    is_retryable,
    queue_wait_s,
)
from gnn_faas.traces import twitter


def test_launch_only_when_no_instance_is_idle_and_n_req_exceeds_instances():
    clock = FakeClock()
    p = LoadAwarePolicy(max_instances=3, clock=clock, name="mem")
    # nothing exists: n_req = 1 > 0 -> launch; the item waits for it (pending)
    assert p.submit("a") == [Launch("mem-1")]
    assert list(p.pending) == ["a"]
    # n_req = 2 > 1 instance (launching) -> a second launch
    assert p.submit("b") == [Launch("mem-2")]
    clock.advance(1.5)  # cold start
    assert p.ready("mem-1") == [Run("mem-1", "a")]
    assert p.ready("mem-2") == [Run("mem-2", "b")]
    # c: no idle instance, n_req = 3 > 2 -> launch AND queue on the warm
    # instance with the shortest queue (it bypasses the cold start)
    assert p.submit("c") == [Launch("mem-3")]
    assert p.queue_lengths() == {"mem-1": 1, "mem-2": 0, "mem-3": 0}
    # d: n_req = 4 > 3 but max_instances reached -> only queued, shortest queue
    assert p.submit("d") == []
    assert p.queue_lengths() == {"mem-1": 1, "mem-2": 1, "mem-3": 0}
    # mem-1 finishes: its own queue first
    clock.advance(0.2)
    assert p.finished("mem-1") == [Run("mem-1", "c")]
    # the new instance is ready: its queue is empty -> steals d
    assert p.ready("mem-3") == [Run("mem-3", "d")]
    assert p.steals == 1 and p.launches == 3
    # an idle instance exists -> run at once, no launch
    assert p.finished("mem-2") == []
    assert p.instances["mem-2"].state == IDLE
    assert p.submit("e") == [Run("mem-2", "e")]
    # all busy, n_req = 3 == n_instances -> queue, no launch
    p2 = LoadAwarePolicy(max_instances=5, clock=clock)
    for item, iid in (("x", "fn-1"), ("y", "fn-2")):
        assert p2.submit(item) == [Launch(iid)]
        p2.ready(iid)
    assert p2.finished("fn-1") == [] and p2.submit("z") == [Run("fn-1", "z")]
    assert p2.n_requests == 2 and p2.n_instances == 2
    assert p2.submit("w") == [Launch("fn-3")]  # 3 > 2
    assert p2.submit("v") == [Launch("fn-4")]  # 4 > 3
    # queue waits are measured on the clock
    assert p.wait_percentiles()["queue_wait_p99_s"] == pytest.approx(1.5, abs=0.21)


def test_idle_instance_takes_from_the_tail_of_the_longest_queue():
    p = LoadAwarePolicy(max_instances=3)
    for iid in ("fn-1", "fn-2"):
        p.submit(f"first-{iid}")
        p.ready(iid)
    # fill queues: fn-1 gets a1 a2 a3, fn-2 gets b1 (placed by hand to set the scene)
    p.instances["fn-1"].queue.extend(["a1", "a2", "a3"])
    p.instances["fn-2"].queue.extend(["b1"])
    steals = p.steals  # fn-2 stole "first-fn-2" (queued on fn-1 during its launch)
    assert steals == 1
    launch = p.launch()
    assert p.ready(launch.instance) == [Run(launch.instance, "a3")]  # tail of the longest
    assert list(p.instances["fn-1"].queue) == ["a1", "a2"]
    # fn-2 finishes: own queue first (b1), not stealing
    assert p.finished("fn-2") == [Run("fn-2", "b1")]
    assert p.finished("fn-2") == [Run("fn-2", "a2")]  # then steals the tail
    assert p.finished(launch.instance) == [Run(launch.instance, "a1")]
    assert p.finished("fn-1") == [] and p.steals - steals == 3


def test_failed_instance_hands_back_its_work():
    p = LoadAwarePolicy(max_instances=2)
    p.submit("a")
    p.ready("fn-1")
    p.submit("b")  # launches fn-2, queued on fn-1
    actions, running = p.failed("fn-1")
    assert running == "a"  # the caller retries it
    # b was queued on the dead instance: it now waits for fn-2 (launching)
    assert actions == [] and list(p.pending) == ["b"]
    assert p.ready("fn-2") == [Run("fn-2", "b")]
    # a launch that fails with work pending and nothing left starts another
    q = LoadAwarePolicy(max_instances=1)
    q.submit("x")
    actions, running = q.failed("fn-1")
    assert running is None and actions == [Launch("fn-2")]
    with pytest.raises(ValueError):
        q.finished("fn-2")  # still launching


def test_remove_only_idle_instances_without_work():
    p = LoadAwarePolicy(max_instances=2)
    p.submit("a")
    assert not p.remove("fn-1")  # launching
    p.ready("fn-1")
    assert not p.remove("fn-1")  # busy
    p.finished("fn-1")
    assert p.remove("fn-1") and p.n_instances == 0


@dataclass
class Sim:
    """A discrete-event run of the policy over a real arrival stream."""

    policy: LoadAwarePolicy
    launch_s: float
    service_s: float


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    max_instances=st.integers(1, 6),
    service_ms=st.integers(5, 200),
    launch_ms=st.integers(0, 1000),
)
def test_policy_invariants_on_a_real_trace(seed, max_instances, service_ms, launch_ms):
    """Replay Twitter arrivals through the policy with a fake clock and check,
    at every event: launches happen only when no instance was idle and
    n_req > n_instances < max; an idle instance never coexists with queued
    work; every item runs exactly once."""
    arrivals = twitter.arrivals(40, 2, seed=seed)
    clock = FakeClock()
    p = LoadAwarePolicy(max_instances, clock)
    events: list[tuple[float, int, str, str]] = [
        (t, 1, "submit", str(i)) for i, t in enumerate(arrivals)
    ]
    ran: Counter[str] = Counter()
    rng = np.random.default_rng(seed)

    def apply(actions, now):
        for a in actions:
            if isinstance(a, Launch):
                events.append((now + launch_ms / 1e3, 0, "ready", a.instance))
            else:
                ran[a.item] += 1
                dur = service_ms / 1e3 * rng.uniform(0.5, 1.5)
                events.append((now + dur, 0, "finished", a.instance))

    while events:
        events.sort()
        t, _, kind, arg = events.pop(0)
        clock.set(t)
        if kind == "submit":
            idle_before = any(s.state == IDLE for s in p.instances.values())
            n_req, n_inst = p.n_requests + 1, p.n_instances
            actions = p.submit(arg)
            if any(isinstance(a, Launch) for a in actions):
                assert not idle_before and n_req > n_inst and n_inst < max_instances
        else:
            actions = getattr(p, kind)(arg)
        apply(actions, t)
        queued = sum(len(s.queue) for s in p.instances.values()) + len(p.pending)
        if queued:
            assert not any(s.state == IDLE for s in p.instances.values())
        assert all(s.current is not None for s in p.instances.values() if s.state == BUSY)
    assert set(ran) == {str(i) for i in range(arrivals.size)} and set(ran.values()) == {1}
    assert p.launches <= max_instances


# -- FunctionPool ----------------------------------------------------------------------


@dataclass(frozen=True)
class FakeInstance:
    id: int
    url: str


class FakePlatform:
    def __init__(self, fail_launches: int = 0):
        self.count = 0
        self.fail_launches = fail_launches
        self.stopped: list[FakeInstance] = []
        self.lock = threading.Lock()

    def launch(self) -> FakeInstance:
        with self.lock:
            self.count += 1
            if self.count <= self.fail_launches:
                raise OSError("no capacity")
            return FakeInstance(self.count, f"http://127.0.0.1:{9000 + self.count}")


def test_function_pool_retries_work_of_a_failing_instance():
    platform = FakePlatform()
    pool = FunctionPool(
        "memory", platform.launch, FakeClock(), max_instances=2, on_failed=platform.stopped.append
    )

    def work(inst: FakeInstance) -> str:
        if inst.id == 1:
            raise Unavailable("instance killed")
        return f"done on {inst.id}"

    try:
        fut = pool.submit(work)
        assert fut.result(timeout=10) == "done on 2"
        assert [i.id for i in platform.stopped] == [1]
        stats = pool.stats
        assert stats["retries"] == 1 and stats["instance_failures"] == 1
        assert stats["launches"] == 2 and stats["instances"] == 1
        # ordinary errors are the caller's: no retry, the instance stays
        bad = pool.submit(lambda inst: (_ for _ in ()).throw(InvalidRequest("bad ids")))
        with pytest.raises(InvalidRequest):
            bad.result(timeout=10)
        assert pool.stats["retries"] == 1 and pool.stats["instances"] == 1
    finally:
        pool.close()


def test_function_pool_gives_up_after_max_attempts():
    platform = FakePlatform()
    pool = FunctionPool("compute", platform.launch, FakeClock(), max_instances=4, max_attempts=3)

    def always_down(inst):
        raise ConnectionResetError("connection reset by peer")

    try:
        fut = pool.submit(always_down)
        with pytest.raises(Unavailable, match="failed on 3 instance"):
            fut.result(timeout=10)
        assert pool.stats["retries"] == 2 and pool.stats["instance_failures"] == 3
    finally:
        pool.close()
    # launches that keep failing end in Unavailable, not a hang
    broken = FunctionPool("x", FakePlatform(fail_launches=100).launch, FakeClock(), 2)
    try:
        with pytest.raises(Unavailable, match="could not launch"):
            broken.submit(lambda inst: 1).result(timeout=10)
        assert broken.stats["launch_failures"] == 3
    finally:
        broken.close()


def test_function_pool_serves_a_burst_and_scales_down():
    platform = FakePlatform()
    pool = FunctionPool("memory", platform.launch, FakeClock(), max_instances=3, min_instances=1)
    assert pool.has_ready_instance()  # nothing warm yet, but it may launch
    pool.start()
    pool.start()  # idempotent
    gate = threading.Event()

    def work(inst, i=0):
        gate.wait(10)
        return i * i

    try:
        futs = [pool.submit(lambda inst, i=i: work(inst, i)) for i in range(20)]
        gate.set()
        done, _ = wait(futs, timeout=20)
        assert len(done) == 20 and [f.result() for f in futs] == [i * i for i in range(20)]
        stats = pool.stats
        assert stats["completed"] == 20 and 1 <= stats["launches"] <= 3
        snap = pool.snapshot()
        assert snap["name"] == "memory" and snap["policy"] == "load_aware"
        rows = snap["instances"]
        assert len(rows) == stats["instances"] and snap["pending"] == 0
        assert all(s["state"] == "idle" and s["queue_length"] == 0 for s in rows)
        assert all(s["url"].startswith("http://127.0.0.1:") for s in rows)
        assert sum(snap["queues"].values()) == 0
        removed = pool.scale_to(0)
        assert len(removed) == stats["instances"] and pool.stats["instances"] == 0
        assert pool.idle_instances() == []
    finally:
        pool.stop()
    assert not pool.has_ready_instance()
    with pytest.raises(Unavailable):
        pool.submit(lambda inst: 1)


def test_request_centric_policy_waits_for_its_own_cold_start():
    p = RequestCentricPolicy(max_instances=2)
    assert p.submit("a") == [Launch("fn-1")]
    assert p.submit("b") == [Launch("fn-2")]  # no idle instance: launch per request
    assert p.ready("fn-2") == [Run("fn-2", "b")]  # b waited for its own instance
    assert p.submit("c") == []  # at the cap: queued on the shortest queue
    assert p.queue_lengths() == {"fn-1": 1, "fn-2": 1}
    assert p.ready("fn-1") == [Run("fn-1", "a")]
    assert p.finished("fn-1") == []  # no stealing: c stays with fn-2
    assert p.finished("fn-2") == [Run("fn-2", "c")] and p.steals == 0
    # the FunctionPool runs it too, and failing launches still end in Unavailable
    broken = FunctionPool(
        "rc", FakePlatform(fail_launches=100).launch, FakeClock(), 2, policy="request_centric"
    )
    try:
        with pytest.raises(Unavailable, match="could not launch"):
            broken.submit(lambda inst: 1).result(timeout=10)
    finally:
        broken.close()
    ok = FunctionPool("rc", FakePlatform().launch, FakeClock(), 2, policy="request_centric")
    try:
        assert ok.submit(lambda inst: inst.id).result(timeout=10) == 1
    finally:
        ok.close()


def test_retryable_errors():
    import requests

    assert is_retryable(Unavailable("x")) and is_retryable(ConnectionRefusedError())
    assert is_retryable(requests.exceptions.ConnectionError())
    assert not is_retryable(InvalidRequest("x")) and not is_retryable(TimeoutError())


def test_function_pool_runs_work_and_callbacks_in_the_submitters_context():
    """A request's id reaches the calls made for it: the work and the future's
    done-callbacks (where the orchestrator chains Aggregate -> Update) run in the
    context of the thread that submitted, not of the pool's threads."""
    from gnn_faas import request_id

    pool = FunctionPool("memory", FakePlatform().launch, FakeClock(), max_instances=2)
    pool.start()
    seen: dict[str, str | None] = {}
    chained = threading.Event()
    try:
        traces = [request_id.new_trace() for _ in range(4)]
        futs = []
        for ctx in traces:
            with request_id.bound(ctx):
                fut = pool.submit(lambda inst: request_id.current_request_id())

                def then(f, want=ctx.trace_id):
                    seen[want] = request_id.current_request_id()
                    if len(seen) == len(traces):
                        chained.set()

                fut.add_done_callback(then)
                futs.append(fut)
        assert [f.result(timeout=10) for f in futs] == [t.trace_id for t in traces]
        assert chained.wait(10)
        assert seen == {t.trace_id: t.trace_id for t in traces}
        # outside any request the pool's work sees none
        assert pool.submit(lambda inst: request_id.current()).result(timeout=10) is None
    finally:
        pool.stop()


def _wait_for(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_inline_submit_runs_on_the_caller_when_an_instance_is_idle():
    pool = FunctionPool("memory", FakePlatform().launch, FakeClock(), max_instances=1)
    pool.start()
    try:
        # no warm instance yet: the work waits for the launch on a pool thread
        first = pool.submit(lambda inst: threading.get_ident(), inline=True)
        assert first.result(timeout=10) != threading.get_ident()
        _wait_for(lambda: pool.idle_instances() != [])
        # an idle warm instance: the call ran on this thread and is done on return
        here = pool.submit(lambda inst: (threading.get_ident(), inst.id), inline=True)
        assert here.done() and here.result() == (threading.get_ident(), 1)
        assert pool.stats["inline_runs"] == 1
        # the only instance busy: an inline submit queues like any other
        gate = threading.Event()
        busy = pool.submit(lambda inst: gate.wait(10))
        _wait_for(lambda: pool.idle_instances() == [])
        queued = pool.submit(lambda inst: threading.get_ident(), inline=True)
        assert not queued.done()
        gate.set()
        assert busy.result(timeout=10) is True
        assert queued.result(timeout=10) != threading.get_ident()
        assert pool.stats["inline_runs"] == 1 and pool.stats["completed"] == 4
        # an error raised inline reaches the future, and the instance serves on
        bad = pool.submit(lambda inst: (_ for _ in ()).throw(InvalidRequest("bad")), inline=True)
        with pytest.raises(InvalidRequest):
            bad.result(timeout=0)
        assert pool.submit(lambda inst: 7, inline=True).result(timeout=0) == 7
    finally:
        pool.close()


def _serve_alone(p: LoadAwarePolicy, clock: FakeClock, items: range, service_s: float) -> None:
    """Items one at a time on an idle instance: no queue wait, ``service_s`` each."""
    for i in items:
        [run] = p.submit(i)
        clock.advance(service_s)
        assert p.finished(run.instance) == []


def test_launch_budget_launches_only_when_queueing_is_sustained():
    clock = FakeClock()
    budget = LoadAwarePolicy(4, clock=clock, name="cmp", launch_wait_ratio=0.1)
    faas = LoadAwarePolicy(4, clock=FakeClock(), name="cmp")
    for p in (budget, faas):
        clock = p.clock
        assert p.submit("first") == [Launch("cmp-1")]
        assert p.ready("cmp-1") == [Run("cmp-1", "first")]
        assert p.finished("cmp-1") == []
        _serve_alone(p, clock, range(300), 0.010)
        assert p.submit("running")[0].instance == "cmp-1"
    assert budget.mean_service_s == pytest.approx(0.010, rel=0.1)
    assert budget.mean_wait_s == 0.0
    # a transient queue: FaaS-GNN's rule launches, the budget (W̄ 0 < 0.1·S̄) queues
    assert faas.submit("burst") == [Launch("cmp-2")]
    assert budget.submit("burst") == [] and budget.queue_lengths() == {"cmp-1": 1}
    # sustained: every item now waits one service time (10 ms) behind another;
    # W̄ = 10 ms·(1 − 0.99^j) reaches 0.1·S̄ ≈ 1 ms at about the 11th such item
    launched_at = None
    clock = budget.clock
    for j in range(1, 40):
        clock.advance(0.010)
        assert budget.finished("cmp-1")[0].instance == "cmp-1"  # takes the queued one
        if budget.submit(f"q{j}"):
            launched_at = j
            break
    assert launched_at is not None and 5 < launched_at <= 15
    assert budget.mean_wait_s >= 0.1 * budget.mean_service_s
    assert budget.n_instances == 2
    # while that instance launches, the queue keeps waiting: no second launch
    for j in range(40, 60):
        clock.advance(0.010)
        budget.finished("cmp-1")
        assert budget.submit(f"q{j}") == []
    # once it is ready the waits are measured afresh: a launch needs
    # MIN_EVIDENCE new waits however long the old ones were
    budget.ready("cmp-2")
    assert budget.mean_wait_s == 0.0
    launched_at = None
    for j in range(60, 400):
        clock.advance(0.010)
        for inst in ("cmp-1", "cmp-2"):
            if budget.instances[inst].state == BUSY:
                budget.finished(inst)
        for k in range(3):  # 3 items per 10 ms on 2 instances: the queue grows
            if any(isinstance(a, Launch) for a in budget.submit(f"r{j}.{k}")):
                launched_at = launched_at or j
    assert launched_at is not None and launched_at - 60 >= MIN_EVIDENCE // 3
    assert budget.n_instances == 3


def _queue_steadily(p: LoadAwarePolicy, clock: FakeClock, items: range, service_s: float,
                    wait_s: float) -> int | None:  # fmt: skip
    """On one busy instance, every item arrives ``service_s − wait_s`` after the
    one before it started, so it waits ``wait_s``; returns the item at which
    the pool asked for a launch (None: it never did)."""
    for j in items:
        clock.advance(service_s - wait_s)
        if p.submit(j):
            return j
        clock.advance(wait_s)
        [run] = p.finished(p.warm()[0].id)
        assert run.item == j and run.wait_s == pytest.approx(wait_s)
    return None


def test_shared_launch_budget_gives_the_costlier_pool_the_longer_wait():
    """Two pools of one model share B = r·(S̄_mem + S̄_cmp), split by instance
    memory: a 1 ms sustained wait launches the 256 MB memory pool (share
    0.8 ms, alone r·S̄ = 1.8 ms) but not the 512 MB compute pool (share 1.6 ms,
    alone r·S̄ = 0.6 ms)."""
    budget = LaunchBudget(0.1)
    mem = LoadAwarePolicy(4, clock=FakeClock(), name="mem", budget=budget, memory_mb=256)
    cmp = LoadAwarePolicy(4, clock=FakeClock(), name="cmp", budget=budget, memory_mb=512)
    mem_alone = LoadAwarePolicy(4, clock=FakeClock(), name="mem", launch_wait_ratio=0.1)
    cmp_alone = LoadAwarePolicy(4, clock=FakeClock(), name="cmp", launch_wait_ratio=0.1)
    pools = {mem: 0.018, cmp: 0.006, mem_alone: 0.018, cmp_alone: 0.006}
    for p, service in pools.items():
        p.ready(p.launch().instance)
        _serve_alone(p, p.clock, range(200), service)
        [run] = p.submit("head")  # the instance is busy from here on
        assert run.wait_s == 0.0
    assert budget.share_s(mem) == pytest.approx(0.1 * 0.024 * 256 / 768)
    assert budget.share_s(cmp) == pytest.approx(0.1 * 0.024 * 512 / 768)
    assert cmp_alone.budget.share_s(cmp_alone) == pytest.approx(0.1 * 0.006)
    launched = {p: _queue_steadily(p, p.clock, range(600), s, 0.001) for p, s in pools.items()}
    # W̄ = 1 ms·(1 − 0.99^j) / (1 − 0.99^(201 + j)) (bias-corrected after the
    # 201 items that did not wait) passes 0.8 ms near j = 150, 0.6 ms near j = 90
    assert 130 < launched[mem] < 170 and 75 < launched[cmp_alone] < 105
    assert launched[cmp] is None and launched[mem_alone] is None
    assert cmp.mean_wait_s == pytest.approx(0.001, rel=0.01)
    assert cmp.mean_wait_s < budget.share_s(cmp)


def _pairs(p: LoadAwarePolicy, clock: FakeClock, items: range, per_arrival: int) -> list:
    """Every 30 ms ``per_arrival`` items arrive at once, each served in 9 ms on
    its own idle instance; returns what ``surplus`` said after each arrival."""
    said = []
    for j in items:
        runs = [p.submit((j, k)) for k in range(per_arrival)]
        assert all(len(r) == 1 and isinstance(r[0], Run) for r in runs)
        clock.advance(0.009)
        for [run] in runs:
            p.finished(run.instance)
        clock.advance(0.021)
        said.append(p.surplus())
    return said


def test_budget_reaps_the_newest_instance_once_demand_fell():
    """Items in pairs need both instances (on one fewer, the second of each
    pair would wait 9 ms: Ŵ = 4.5 ms, far over the share 0.1·9 ms): both stay. Once items
    come one at a time, one instance would have served them without a wait:
    the newest goes, after the evidence a launch needs, while FaaS-GNN's
    pool (no budget) keeps it for its keep-alive."""
    budget = LoadAwarePolicy(4, clock=FakeClock(), name="cmp", launch_wait_ratio=0.1)
    faas = LoadAwarePolicy(4, clock=FakeClock(), name="cmp")
    for p in (budget, faas):
        for _ in range(2):
            p.ready(p.launch().instance)
        assert _pairs(p, p.clock, range(300), 2) == [None] * 300
        said = _pairs(p, p.clock, range(300, 700), 1)
        if p is faas:
            assert said == [None] * 400
            continue
        first = next(j for j, s in enumerate(said) if s is not None)
        # Ŵ = 4.5 ms·0.99^j drops under REAP_MARGIN·0.9 ms near the 189th lone item
        assert said[first] == "cmp-2" and 180 < first < 200
        assert p.remove("cmp-2") and p.n_instances == 1
        assert p.surplus() is None  # the last instance goes only at its keep-alive


def test_one_fewer_replays_first_come_first_served():
    """Ŵ's replay: items in arrival order on n − 1 instances, each as soon as
    its own service time is known (they finish out of order)."""
    one = _OneFewer(1)
    for item, t in (("a", 0.0), ("b", 0.001), ("c", 0.030)):
        one.arrived(item, t)
    one.served("b", 0.004)  # "a" still running: nothing replayed yet
    assert one.wait.n == 0
    one.served("a", 0.010)  # a: 0 wait; b: waits until 0.010
    assert one.wait.n == 2 and one.wait.value == pytest.approx(0.009 / 2, rel=0.01)
    one.dropped("c")  # never served here: it holds nothing up
    assert one.wait.n == 2 and not one.order
    two = _OneFewer(2)
    for item, t in (("a", 0.0), ("b", 0.0), ("c", 0.001)):
        two.arrived(item, t)
    for item in ("a", "b", "c"):
        two.served(item, 0.005)
    assert two.wait.value == pytest.approx(0.004 / 3, rel=0.02)  # c waits for a at 0.005


def test_reap_surplus_stops_nothing_below_the_minimum():
    """``FunctionPool.reap_surplus`` removes what the policy calls surplus,
    never below ``min_instances``, and hands it back to be stopped."""
    launched = []

    def launch():
        launched.append(object())
        return launched[-1]

    for minimum, expected in ((1, 1), (2, 0)):
        pool = FunctionPool("cmp", launch, FakeClock(), max_instances=2,
                            min_instances=minimum, launch_wait_ratio=0.1)  # fmt: skip
        try:
            for _ in range(2):
                pool.policy.ready(pool.policy.launch().instance)
            pool._instances.update({iid: object() for iid in pool.policy.instances})
            pool.policy.surplus = lambda: "cmp-2"
            assert len(pool.reap_surplus()) == expected
            assert pool.policy.n_instances == 2 - expected
        finally:
            pool.close()


def test_an_item_reads_its_queue_wait():
    """The wait a pool's item had, for the orchestrator's figures: a second
    item queued behind a running one reads the time it waited."""
    clock = FakeClock()
    release = threading.Event()
    pool = FunctionPool("mem", lambda: object(), clock, max_instances=1)
    try:
        first = pool.submit(lambda inst: (release.wait(10), queue_wait_s())[1])
        deadline = time.monotonic() + 10
        while not pool.policy.warm() and time.monotonic() < deadline:  # its launch
            time.sleep(0.001)
        second = pool.submit(lambda inst: queue_wait_s())
        clock.advance(0.25)
        release.set()
        assert first.result(timeout=10) == 0.0
        assert second.result(timeout=10) == pytest.approx(0.25)
        assert queue_wait_s() == 0.0  # outside any item
    finally:
        pool.close()


def test_launch_budget_follows_the_models_mode_and_objective():
    from gnn_faas.config import ModelBufferSettings, ModelServingConfig, ServingConfig
    from gnn_faas.scheduler.model_functions import launch_wait_ratio

    def ratio(mode="graph_sharing", **buffers):
        m = ModelServingConfig(name="m", graph="g", mode=mode,
                               buffers=ModelBufferSettings(**buffers))  # fmt: skip
        return launch_wait_ratio(ServingConfig(models=(m,)), m)

    assert ratio() == pytest.approx(0.1)  # balanced by default, its slack
    assert ratio(latency_slack=0.3) == pytest.approx(0.3)
    assert ratio(objective="cost") is None  # today's pools
    assert ratio(objective="latency") is None
    assert ratio(mode="no_sharing") is None  # the baselines keep FaaS-GNN's rule
    assert ratio(mode="request_centric") is None
    with pytest.raises(ValueError):
        LoadAwarePolicy(2, launch_wait_ratio=-1.0)

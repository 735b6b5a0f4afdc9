"""Decision history and hindsight-best timeout decisions by replay.

Serving records every decision point in a :class:`TimeoutHistory` (a bounded,
thread-safe ring buffer of ``(buffer_id, time, state, decision, outcome)``,
the outcome being the buffer's gain μ once it closes).

Fitting needs the decision that *would have been* best. :func:`replay_buffers` runs an
arrival stream through :class:`~gnn_faas.gateway.buffer_pool.BufferPoolState`
as a discrete-event simulation on a fake timeline (events at their exact
times: arrivals, decision points, closes). With ``label=True``, at each
decision point of buffer ``b`` it forks the whole pool once per candidate
``d ∈ {−1, 0, 1..i}``, applies ``d`` to ``b`` and keeps ``b``'s deadline from then
on (the other buffers follow the policy), simulates the real future arrivals
until the requests ``b`` holds have all closed, and scores the candidate by the
gain those requests got: ``b``'s ``μ = α·S − β·D`` when it closes (or, if global
moves emptied ``b``, the mean μ of the buffers its requests closed in). The best
candidate is the label (ties go to the shorter wait). ``follow="oracle"`` then
applies the label (the states an ideal configurator visits);
``follow="policy"`` applies the configurator's own decision (DAgger: the states
the fitted tree actually visits). :func:`fit_timeout_tree` alternates the two
and refits.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnn_faas.clock import FakeClock
from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.buffer import FEATURES, Buffer, ClosedBuffer, PendingRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState, closed_gain
from gnn_faas.gateway.timeout_configurator import (
    DecisionTreeTimeoutConfigurator,
    FixedTimeoutConfigurator,
    TimeoutConfigurator,
)
from gnn_faas.storage.fetcher import KHopFetcher

# Completion may equal arrival + SLO up to float rounding of the sums involved.
SLO_TOLERANCE_S = 1e-9


class TimeoutHistory:
    """Bounded ring buffer of decision records (thread-safe).

    ``record`` stores a decision; ``complete(buffer_id, outcome)`` fills the
    outcome (μ at close) of that buffer's records still in the ring.
    """

    def __init__(self, capacity: int = 10_000):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = int(capacity)
        self._states = np.zeros((self.capacity, len(FEATURES)))
        self._decisions = np.zeros(self.capacity, np.int64)
        self._outcomes = np.full(self.capacity, np.nan)
        self._buffer_ids = np.full(self.capacity, -1, np.int64)
        self._times = np.zeros(self.capacity)
        self._count = 0  # records ever written
        self._open: dict[int, list[int]] = {}  # buffer id -> ring positions
        self._lock = threading.Lock()

    def record(self, buffer_id: int, time: float, state: np.ndarray, decision: int) -> None:
        with self._lock:
            pos = self._count % self.capacity
            old = int(self._buffer_ids[pos])
            if old in self._open:  # overwritten before its buffer closed
                left = [p for p in self._open[old] if p != pos]
                if left:
                    self._open[old] = left
                else:
                    del self._open[old]
            self._states[pos] = state
            self._decisions[pos] = decision
            self._outcomes[pos] = np.nan
            self._buffer_ids[pos] = buffer_id
            self._times[pos] = time
            self._open.setdefault(int(buffer_id), []).append(pos)
            self._count += 1

    def complete(self, buffer_id: int, outcome: float) -> None:
        with self._lock:
            for pos in self._open.pop(int(buffer_id), []):
                if self._buffer_ids[pos] == buffer_id:
                    self._outcomes[pos] = outcome

    def __len__(self) -> int:
        with self._lock:
            return min(self._count, self.capacity)

    def arrays(self) -> dict[str, np.ndarray]:
        """Records in time order: ``buffer_id``, ``time``, ``state`` ``[m, 5]``,
        ``decision``, ``outcome`` (NaN while the buffer is open)."""
        with self._lock:
            m = min(self._count, self.capacity)
            start = self._count % self.capacity if self._count > self.capacity else 0
            order = (start + np.arange(m)) % self.capacity
            return {
                "buffer_id": self._buffer_ids[order].copy(),
                "time": self._times[order].copy(),
                "state": self._states[order].copy(),
                "decision": self._decisions[order].copy(),
                "outcome": self._outcomes[order].copy(),
            }

    def decision_histogram(self) -> dict[str, int]:
        d = self.arrays()["decision"]
        values, counts = np.unique(d, return_counts=True)
        return {str(int(v)): int(c) for v, c in zip(values, counts, strict=True)}


# -- replay --------------------------------------------------------------------------


@dataclass
class BufferReplay:
    """What a replay produced. ``completion[i]``: when request ``i`` finishes
    (its buffer's close + the modelled execution time)."""

    arrivals: np.ndarray
    completion: np.ndarray
    closed: list[ClosedBuffer]
    states: np.ndarray
    decisions: np.ndarray
    labels: np.ndarray | None
    slo_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def slo_violations(self) -> int:
        late = self.completion > self.arrivals + self.slo_s + SLO_TOLERANCE_S
        return int(np.count_nonzero(late))

    def figures(self) -> dict[str, Any]:
        latency = self.completion - self.arrivals
        s = np.array([c.sharing_degree for c in self.closed]) if self.closed else np.zeros(1)
        union = sum(c.union_size for c in self.closed)
        total = sum(c.total_vertices for c in self.closed)
        per_buffer = np.array([c.num_requests for c in self.closed]) if self.closed else [0]
        return {
            "requests": int(self.arrivals.size),
            "buffers": len(self.closed),
            "slo_violations": self.slo_violations,
            "mean_sharing_degree": float(s.mean()),
            "overall_sharing_degree": 1.0 - union / total if total else 0.0,
            "requests_per_buffer": float(np.mean(per_buffer)),
            "latency_p50_ms": float(np.percentile(latency, 50) * 1e3),
            "latency_p99_ms": float(np.percentile(latency, 99) * 1e3),
            "latency_max_ms": float(latency.max() * 1e3),
            "decision_points": int(self.decisions.size),
            "decisions": self.stats.get("decisions", {}),
            "close_reasons": self.stats.get("close_reasons", {}),
            "moves": self.stats.get("moves", 0),
        }


def _request(i: int, arrivals: np.ndarray, sets: Sequence[np.ndarray], slo: float):
    return PendingRequest(str(i), sets[i], float(arrivals[i]), float(arrivals[i]) + slo, i)


def _run_until_closed(
    pool: BufferPoolState,
    watch: set[str],
    arrivals: np.ndarray,
    sets: Sequence[np.ndarray],
    start: int,
    decide,
    slo: float,
) -> list[ClosedBuffer]:
    """Simulate from the pool's present until every request id in ``watch`` has closed;
    returns the closed buffers holding them."""
    hits: list[ClosedBuffer] = []
    left = set(watch)

    def take(closed: list[ClosedBuffer]) -> None:
        for c in closed:
            ids = {r.id for r in c.requests} & left
            if ids:
                hits.append(c)
                left.difference_update(ids)

    j = start
    while left:
        t_evt = pool.next_event_time()
        t_arr = float(arrivals[j]) if j < arrivals.size else math.inf
        if t_evt <= t_arr:
            if math.isinf(t_evt):
                break
            take(pool.advance(t_evt, decide))
        else:
            _, _, closed = pool.submit(_request(j, arrivals, sets, slo), t_arr)
            take(closed)
            j += 1
    return hits


def label_decision(
    pool: BufferPoolState,
    buffer: Buffer,
    now: float,
    arrivals: np.ndarray,
    sets: Sequence[np.ndarray],
    next_arrival: int,
    policy: TimeoutConfigurator,
) -> tuple[int, np.ndarray]:
    """Hindsight-best decision for ``buffer`` at ``now`` and each candidate's gain."""
    c = pool.config
    candidates = np.arange(-1, c.max_steps + 1)
    gains = np.empty(candidates.size)
    watch = {r.id for r in buffer.requests}
    bid = buffer.buffer_id

    def decide(b: Buffer, state: np.ndarray, t: float) -> int:
        return 0 if b.buffer_id == bid else int(policy.decide(state))

    for k, d in enumerate(candidates):
        fork = pool.copy()
        closed_now = fork.apply_decision(buffer.slot, int(d), now)
        if closed_now is not None:
            hits = [closed_now]
        else:
            hits = _run_until_closed(fork, watch, arrivals, sets, next_arrival, decide, c.slo_s)
        own = [h for h in hits if h.buffer_id == bid]
        if own:
            gains[k] = closed_gain(own[0], c.alpha, c.beta, c.slo_s)
        else:
            weights = [sum(r.id in watch for r in h.requests) for h in hits]
            mus = [closed_gain(h, c.alpha, c.beta, c.slo_s) for h in hits]
            gains[k] = float(np.average(mus, weights=weights)) if hits else -math.inf
    best = int(candidates[int(np.argmax(gains))])  # first max: the shortest wait
    return best, gains


def replay_buffers(
    arrivals: np.ndarray,
    vertex_sets: Sequence[np.ndarray],
    config: BufferConfig,
    num_nodes: int,
    configurator: TimeoutConfigurator,
    *,
    label: bool = False,
    follow: str = "policy",
    exec_time_s: float | None = None,
) -> BufferReplay:
    """Replay requests arriving at ``arrivals`` (sorted seconds) with k-hop
    vertex sets ``vertex_sets`` through a buffer pool on a fake timeline.

    Execution is modelled as ``exec_time_s`` (default ``config.exec_estimate_s``)
    after each close. ``label``: compute hindsight-best decisions (slower);
    ``follow``: ``"policy"`` applies the configurator's decisions, ``"oracle"``
    the labels.
    """
    if follow not in ("policy", "oracle"):
        raise ValueError("follow must be 'policy' or 'oracle'")
    if follow == "oracle" and not label:
        raise ValueError("follow='oracle' needs label=True")
    arrivals = np.asarray(arrivals, dtype=np.float64)
    if arrivals.ndim != 1 or len(vertex_sets) != arrivals.size:
        raise ValueError("need one vertex set per arrival")
    if arrivals.size and np.any(np.diff(arrivals) < 0):
        raise ValueError("arrivals must be sorted")
    slo = config.slo_s
    exec_s = config.exec_estimate_s if exec_time_s is None else float(exec_time_s)
    pool = BufferPoolState(config, num_nodes)
    closed: list[ClosedBuffer] = []
    states: list[np.ndarray] = []
    taken: list[int] = []
    labels: list[int] = []
    cursor = [0]

    def decide(b: Buffer, state: np.ndarray, now: float) -> int:
        d = int(configurator.decide(state))
        states.append(state)
        if label:
            best, _ = label_decision(pool, b, now, arrivals, vertex_sets, cursor[0], configurator)
            labels.append(best)
            if follow == "oracle":
                d = best
        taken.append(d)
        return d

    # Events in time order on a fake clock; at equal times buffer events
    # (decisions, closes) go before the arrival.
    clock = FakeClock(float(arrivals[0]) if arrivals.size else 0.0)
    while cursor[0] < arrivals.size or pool.open_buffers():
        t_evt = pool.next_event_time()
        i = cursor[0]
        t_arr = float(arrivals[i]) if i < arrivals.size else math.inf
        if t_evt <= t_arr:
            clock.set(t_evt)
            closed.extend(pool.advance(clock.now(), decide))
        else:
            clock.set(t_arr)
            _, _, c = pool.submit(_request(i, arrivals, vertex_sets, slo), clock.now())
            closed.extend(c)
            cursor[0] += 1

    completion = np.full(arrivals.size, np.nan)
    for c in closed:
        idx = np.fromiter((r.payload for r in c.requests), np.int64, len(c.requests))
        completion[idx] = c.closed_at + exec_s
    return BufferReplay(
        arrivals=arrivals,
        completion=completion,
        closed=closed,
        states=np.array(states).reshape(-1, len(FEATURES)),
        decisions=np.array(taken, dtype=np.int64),
        labels=np.array(labels, dtype=np.int64) if label else None,
        slo_s=slo,
        stats=pool.stats(),
    )


def fit_timeout_tree(
    streams: Sequence[tuple[np.ndarray, Sequence[np.ndarray]]],
    config: BufferConfig,
    num_nodes: int,
    *,
    rounds: int = 2,
    max_depth: int = 6,
    min_samples_leaf: int = 10,
    meta: dict[str, Any] | None = None,
) -> tuple[DecisionTreeTimeoutConfigurator, dict[str, Any]]:
    """Record hindsight-labelled history by replaying ``streams`` (each
    ``(arrivals, vertex_sets)``, e.g. one per request rate) and fit the tree.

    Round 1 follows the oracle (labels of the states an ideal configurator
    visits); each later round follows the current tree and adds the states it
    visits with their labels (DAgger), then refits. Returns the configurator
    and a report with, per stream, the replay figures of the fixed-T0
    baseline, the oracle and the fitted tree.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    if not streams:
        raise ValueError("need at least one arrival stream")
    report: dict[str, Any] = {
        "baseline_fixed_t0": [
            replay_buffers(a, u, config, num_nodes, FixedTimeoutConfigurator(0)).figures()
            for a, u in streams
        ],
        "rounds": [],
    }
    policy: TimeoutConfigurator = FixedTimeoutConfigurator(0)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    tree: DecisionTreeTimeoutConfigurator | None = None
    for r in range(rounds):
        follow = "oracle" if r == 0 else "policy"
        for a, u in streams:
            res = replay_buffers(a, u, config, num_nodes, policy, label=True, follow=follow)
            xs.append(res.states)
            ys.append(res.labels)
            if r == 0:
                report.setdefault("oracle", []).append(res.figures())
        x, y = np.concatenate(xs), np.concatenate(ys)
        tree = DecisionTreeTimeoutConfigurator.fit(
            x, y, config.params, max_depth=max_depth, min_samples_leaf=min_samples_leaf
        )
        policy = tree
        values, counts = np.unique(y, return_counts=True)
        report["rounds"].append(
            {
                "follow": follow,
                "samples": int(x.shape[0]),
                "label_histogram": {
                    str(int(v)): int(c) for v, c in zip(values, counts, strict=True)
                },
                "agreement": float(np.mean(tree.decide_many(x) == y)),
            }
        )
    assert tree is not None
    report["fitted"] = [replay_buffers(a, u, config, num_nodes, tree).figures() for a, u in streams]
    report["tree"] = {
        "nodes": tree.tree.node_count,
        "leaves": tree.tree.leaf_count,
        "depth": tree.tree.max_depth,
    }
    keys = ("requests", "slo_violations", "mean_sharing_degree", "overall_sharing_degree")
    tree.meta.update(meta or {})
    tree.meta["replay"] = [{k: f[k] for k in keys} for f in report["fitted"]]
    tree.meta["baseline_replay"] = [{k: f[k] for k in keys} for f in report["baseline_fixed_t0"]]
    return tree, report


def trace_request_stream(
    graph: Any,
    arrivals: np.ndarray,
    hops: int = 2,
    fanouts: Sequence[int] | None = None,
    offset: int = 0,
) -> list[np.ndarray]:
    """k-hop vertex sets (sorted, unique) of the graph's real request order
    (``request_order.bin``), one per arrival: arrival ``i`` asks for vertex
    ``request_order[(offset + i) % k]``. Sets are fetched on demand with the
    :class:`~gnn_faas.storage.fetcher.KHopFetcher`, once per distinct vertex."""
    if not graph.has("request_order"):
        raise InvalidRequest(
            f"graph {graph.name!r} has no request order (request_order.bin): "
            "prepare it from a dataset that has one"
        )
    order = graph.read_blob("request_order")
    if order.size == 0:
        raise InvalidRequest(f"graph {graph.name!r} has an empty request order")
    fetcher = KHopFetcher(graph)
    targets = order[(offset + np.arange(len(arrivals))) % order.size]
    cache: dict[int, np.ndarray] = {}
    sets = []
    for v in targets.tolist():
        u = cache.get(v)
        if u is None:
            u = np.unique(fetcher.fetch([v], hops, fanouts).nodes)
            cache[v] = u
        sets.append(u)
    return sets

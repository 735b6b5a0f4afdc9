"""Global perspective optimisation (λGrapher Algorithm 1): moves raise the total
gain by exactly what they claim, keep every request, and never break an SLO."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gnn_faas.gateway.buffer import PendingRequest
from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState
from gnn_faas.gateway.global_optimizer import optimise, total_gain
from gnn_faas.gateway.timeout_history import trace_request_stream
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph


@pytest.fixture(scope="module")
def bitcoin_sets(tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    graph = open_graph(store, "bitcoin-otc")
    return graph.num_nodes, trace_request_stream(graph, np.zeros(200), hops=2)


def gain(pool: BufferPoolState) -> float:
    c = pool.config
    return total_gain(pool.slots, c.alpha, c.beta, c.slo_s)


def spread(pool: BufferPoolState, sets, start: float = 0.0, step: float = 0.002) -> None:
    """Submit requests at ``start + i·step``, each new one to a fresh slot while
    one is free (``open_below = 1``), so routing alone does not group them."""
    for i, u in enumerate(sets):
        t = start + i * step
        pool.submit(PendingRequest(f"r{i}", u, t, t + pool.config.slo_s), t)


@pytest.mark.parametrize("beta", [0.0, 0.5, 2.0])
def test_each_move_raises_total_gain_by_its_gain(bitcoin_sets, beta):
    n, sets = bitcoin_sets
    cfg = BufferConfig(
        num_buffers=6, open_below=1.0, beta=beta, max_moves=32, fast_path_arrivals=0.0
    )
    checked = 0
    for chunk in range(0, 180, 12):
        pool = BufferPoolState(cfg, n)
        spread(pool, sets[chunk : chunk + 12])
        before_ids = Counter(r.id for b in pool.open_buffers() for r in b.requests)
        moves = pool.plan_moves()
        g = gain(pool)
        for m in moves:
            assert m.gain > 0
            pool.apply_moves([m])
            g_after = gain(pool)
            assert g_after == pytest.approx(g + m.gain, abs=1e-9)
            g = g_after
            checked += 1
        after_ids = Counter(r.id for b in pool.open_buffers() for r in b.requests)
        assert after_ids == before_ids  # nothing lost or duplicated
        for b in pool.open_buffers():  # the index still mirrors the buffers
            union = np.unique(np.concatenate([r.vertex_set for r in b.requests]))
            assert pool.index.union(b.slot).tolist() == union.tolist()
            assert b.union_size == union.size
        if moves:  # greedy stops at a local optimum: nothing positive is left
            assert pool.plan_moves() == [] or len(moves) == cfg.max_moves
    assert checked > 0


def test_moves_never_break_a_request_slo():
    cfg = BufferConfig(
        num_buffers=2, open_below=1.0, exec_estimate_s=0.05, beta=0.0, fast_path_arrivals=0.0
    )
    pool = BufferPoolState(cfg, 100)
    # slot 0: a long buffer (deadline extended to Tmax) holding vertices 0..49
    pool.submit(PendingRequest("big", np.arange(50), 0.0, 0.3), 0.0)
    pool.apply_decision(0, 3, 0.0)
    pool.apply_decision(0, 3, 0.0)
    assert pool.slots[0].close_at == pytest.approx(cfg.tmax)
    # slot 1: a request inside slot 0's vertices but with a tight SLO
    pool.submit(PendingRequest("tight", np.arange(10), 0.01, 0.01 + 0.12), 0.01)
    assert pool.slots[1] is not None
    # moving "tight" into slot 0 would share all its vertices, but slot 0
    # closes at 0.15 > 0.13 - 0.05: not allowed
    moves = pool.plan_moves()
    assert all(m.request_id != "tight" for m in moves)
    pool.apply_moves(moves)
    for b in pool.open_buffers():
        for r in b.requests:
            assert b.close_at <= r.deadline - cfg.exec_estimate_s + 1e-12
    # with a looser SLO the two merge (one of them moves; equal sharing gain)
    pool2 = BufferPoolState(cfg, 100)
    pool2.submit(PendingRequest("big", np.arange(50), 0.0, 0.3), 0.0)
    pool2.apply_decision(0, 3, 0.0)
    pool2.submit(PendingRequest("loose", np.arange(10), 0.01, 0.31), 0.01)
    (m,) = pool2.plan_moves()
    assert m.gain == pytest.approx(cfg.alpha * 10 / 60)
    pool2.apply_moves([m])
    (b,) = pool2.open_buffers()
    assert {r.id for r in b.requests} == {"big", "loose"}


def test_vertex_and_request_caps_bound_moves():
    base = dict(num_buffers=2, open_below=1.0, beta=0.0, fast_path_arrivals=0.0)
    for extra in ({"max_vertices_per_buffer": 55}, {"max_requests_per_buffer": 1}):
        pool = BufferPoolState(BufferConfig(**base, **extra), 100)
        pool.submit(PendingRequest("a", np.arange(50), 0.0, 0.3), 0.0)
        pool.submit(PendingRequest("b", np.arange(40, 60), 0.0, 0.3), 0.0)
        c = pool.config
        assert (
            optimise(
                pool.slots,
                pool.index,
                alpha=c.alpha,
                beta=c.beta,
                slo_s=c.slo_s,
                exec_estimate_s=c.exec_estimate_s,
                max_requests=c.max_requests_per_buffer,
                max_vertices=c.max_vertices_per_buffer,
            )
            == []
        )
    pool = BufferPoolState(BufferConfig(**base), 100)
    pool.submit(PendingRequest("a", np.arange(50), 0.0, 0.3), 0.0)
    pool.submit(PendingRequest("b", np.arange(40, 60), 0.0, 0.3), 0.0)
    moves = pool.plan_moves()
    assert len(moves) == 1
    pool.apply_moves(moves)
    (b,) = pool.open_buffers()  # the emptied buffer is gone, not closed
    assert b.num_requests == 2 and b.union_size == 60
    assert pool.emptied_by_moves == 1 and pool.closed_buffers == 0

"""Routing to the buffer with the highest sharing degree."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest

from gnn_faas.gateway.buffer import Buffer, PendingRequest
from gnn_faas.gateway.router import Router
from gnn_faas.gateway.sharing import SharingIndex, sharing_degree
from gnn_faas.gateway.timeout_history import trace_request_stream
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph


@pytest.fixture(scope="module")
def bitcoin_sets(tmp_path_factory):
    store = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    graph = open_graph(store, "bitcoin-otc")
    return graph.num_nodes, trace_request_stream(graph, np.zeros(80), hops=2)


def fill(index: SharingIndex, slot: int, sets: list[np.ndarray]) -> Buffer:
    b = Buffer(
        buffer_id=slot, slot=slot, opened_at=0.0, deadline=1.0, tmax_at=1.0, next_decision_at=0.1
    )
    for i, u in enumerate(sets):
        b.add(PendingRequest(f"{slot}-{i}", u, 0.0, 1.0), 0.0)
        index.add(slot, u)
    b.union_size = int(index.sizes[slot])
    return b


def test_routes_to_argmax_sharing_on_real_sets(bitcoin_sets):
    n, sets = bitcoin_sets
    index = SharingIndex(n, 3)
    groups = [sets[0:20:3], sets[1:20:3], sets[2:20:3]]
    buffers = [fill(index, s, g) for s, g in enumerate(groups)]
    unions = [reduce(np.union1d, g) for g in groups]
    router = Router(index)
    chosen = set()
    for u in sets[20:]:
        slot, s = router.route(u, buffers)
        degrees = [sharing_degree(u, un) for un in unions]
        assert s == pytest.approx(max(degrees))
        best = [i for i, d in enumerate(degrees) if d == max(degrees)]
        assert slot in best
        if len(best) > 1:  # ties go to the buffer with fewer vertices
            assert unions[slot].size == min(unions[i].size for i in best)
        chosen.add(slot)
    assert len(chosen) > 1  # real requests do not all prefer the same buffer


def test_ties_go_to_fewer_vertices_and_free_slot_at_zero():
    index = SharingIndex(20, 3)
    big = fill(index, 0, [np.arange(0, 10)])
    small = fill(index, 1, [np.arange(0, 4)])
    router = Router(index)
    # both buffers hold all of {1, 2}: S = 1 for each; the smaller one wins
    assert router.route(np.array([1, 2]), [big, small, None]) == (1, 1.0)
    # no overlap with any open buffer: the free slot (an empty buffer) wins
    assert router.route(np.array([15, 16]), [big, small, None]) == (2, 0.0)
    # ... and without a free slot the tie at S = 0 goes to fewer vertices
    assert router.route(np.array([15, 16]), [big, small]) == (1, 0.0)
    # an empty pool opens slot 0
    assert router.route(np.array([3]), [None, None]) == (0, 0.0)


def test_open_below_threshold_opens_a_new_buffer():
    index = SharingIndex(20, 2)
    b = fill(index, 0, [np.arange(0, 10)])
    u = np.array([0, 11, 12, 13])  # S = 0.25
    assert Router(index, open_below=0.0).route(u, [b, None]) == (0, 0.25)
    assert Router(index, open_below=0.25).route(u, [b, None]) == (1, 0.0)
    assert Router(index, open_below=0.25).route(u, [b]) == (0, 0.25)  # no free slot


def test_full_buffers_are_not_candidates():
    index = SharingIndex(30, 2)
    a = fill(index, 0, [np.arange(0, 10), np.arange(5, 12)])
    b = fill(index, 1, [np.arange(20, 25)])
    u = np.arange(0, 6)
    assert Router(index).route(u, [a, b]) == (0, 1.0)
    # request cap: slot 0 is full, slot 1 takes it though it shares nothing
    assert Router(index, max_requests_per_buffer=2).route(u, [a, b]) == (1, 0.0)
    # vertex cap: joining slot 1 would add 6 vertices to its 5 (> 10)
    assert Router(index, 2, max_vertices_per_buffer=10).route(u, [a, b]) == (-1, 0.0)
    assert Router(index, 2, max_vertices_per_buffer=10).route(u, [a, None]) == (1, 0.0)

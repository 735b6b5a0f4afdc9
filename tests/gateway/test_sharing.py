"""Sharing degree: exact against set arithmetic, on random and real k-hop sets."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_faas.errors import InvalidRequest
from gnn_faas.gateway.sharing import (
    SharingIndex,
    as_vertex_set,
    sharing_degree,
    union_sharing_degree,
)
from gnn_faas.gateway.timeout_history import trace_request_stream
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph


@pytest.fixture(scope="module")
def bitcoin_sets(tmp_path_factory):
    """2-hop vertex sets of the first 120 requests of Bitcoin OTC's real order."""
    store = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    graph = open_graph(store, "bitcoin-otc")
    return graph.num_nodes, trace_request_stream(graph, np.zeros(120), hops=2)


vertex_sets = st.lists(st.integers(0, 39), min_size=1, max_size=25).map(
    lambda xs: np.unique(np.array(xs, dtype=np.int64))
)


@settings(max_examples=60, deadline=None)
@given(
    slots=st.lists(st.lists(vertex_sets, max_size=4), min_size=1, max_size=4),
    query=vertex_sets,
    drop=st.integers(0, 3),
)
def test_index_matches_set_arithmetic(slots, query, drop):
    index = SharingIndex(40, len(slots))
    for s, sets in enumerate(slots):
        for u in sets:
            index.add(s, u)
    # removing one request keeps the counts exact (a vertex shared by two stays)
    for s, sets in enumerate(slots):
        if sets and drop < len(sets):
            index.remove(s, sets[drop])
            del sets[drop]
    q = set(query.tolist())
    for s, sets in enumerate(slots):
        union = set().union(*(set(u.tolist()) for u in sets))
        assert index.sizes[s] == len(union)
        assert index.union(s).tolist() == sorted(union)
        assert index.overlaps(query)[s] == len(q & union)
        assert index.degrees(query)[s] == pytest.approx(len(q & union) / len(q))
        assert sharing_degree(query, index.union(s)) == pytest.approx(len(q & union) / len(q))


def test_real_khop_sets(bitcoin_sets):
    n, sets = bitcoin_sets
    index = SharingIndex(n, 4)
    groups = [sets[i:100:4] for i in range(4)]  # 25 requests per slot
    for s, group in enumerate(groups):
        for u in group:
            index.add(s, u)
    unions = [reduce(np.union1d, g) for g in groups]
    for s in range(4):
        assert index.sizes[s] == unions[s].size
    for u in sets[100:]:
        expected = [np.intersect1d(u, un).size / u.size for un in unions]
        np.testing.assert_allclose(index.degrees(u), expected, rtol=0, atol=1e-15)
    # Real requests overlap: the union-based degree of a slot is well above 0.
    for s, group in enumerate(groups):
        total = sum(u.size for u in group)
        deg = union_sharing_degree(int(index.sizes[s]), total)
        assert deg == pytest.approx(1 - unions[s].size / total)
        assert 0.0 < deg < 1.0
    copy = index.copy()
    copy.clear(0)
    assert copy.sizes[0] == 0 and index.sizes[0] == unions[0].size


def test_remove_unknown_set_is_refused():
    index = SharingIndex(10, 1)
    index.add(0, np.array([1, 2]))
    with pytest.raises(ValueError):
        index.remove(0, np.array([3]))


def test_as_vertex_set():
    assert as_vertex_set(np.array([5, 1, 5, 3]), 10).tolist() == [1, 3, 5]
    sorted_in = np.array([1, 4, 9])
    assert as_vertex_set(sorted_in, 10).tolist() == [1, 4, 9]
    for bad in (np.array([1.5]), np.array([[1, 2]]), np.array([3, 10]), np.array([-1, 2])):
        with pytest.raises(InvalidRequest):
            as_vertex_set(bad, 10)
    assert union_sharing_degree(0, 0) == 0.0


@pytest.mark.parametrize("num_slots", [3, 8, 12])
def test_slot_mask_and_counts_agree(num_slots):
    """Up to 8 slots overlaps come from the per-vertex slot bitmask, beyond
    from the count gather: both must equal the counts after adds, removes and
    clears."""
    rng = np.random.default_rng(num_slots)
    index = SharingIndex(300, num_slots)
    held: list[list[np.ndarray]] = [[] for _ in range(num_slots)]
    for step in range(200):
        s = int(rng.integers(num_slots))
        if step % 17 == 16:
            index.clear(s)
            held[s] = []
        elif held[s] and rng.random() < 0.3:
            index.remove(s, held[s].pop(int(rng.integers(len(held[s])))))
        else:
            u = np.unique(rng.integers(0, 300, int(rng.integers(1, 60))))
            index.add(s, u)
            held[s].append(u)
        q = np.unique(rng.integers(0, 300, 40))
        expect = np.count_nonzero(index.counts[q] > 0, axis=0)
        np.testing.assert_array_equal(index.overlaps(q), expect)
        np.testing.assert_array_equal(index.sizes, np.count_nonzero(index.counts, axis=0))

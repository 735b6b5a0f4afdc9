"""Arrivals mapped onto the graph's real request order; k-hop sets computed
once per vertex equal the on-demand fetcher's."""

from __future__ import annotations

import numpy as np

from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.traces.request_stream import build_stream, khop_sets, map_targets, request_order


def test_targets_follow_the_request_order(bitcoin_graph):
    order = request_order(bitcoin_graph)
    t = map_targets(order, order.size + 5, offset=3)
    np.testing.assert_array_equal(t[: order.size - 3], order[3:])
    np.testing.assert_array_equal(t[order.size - 3 : order.size], order[:3])


def test_khop_sets_equal_the_fetcher(bitcoin_graph):
    order = request_order(bitcoin_graph)
    vertices = np.unique(order[:200])
    fetcher = KHopFetcher(bitcoin_graph)
    for hops in (1, 2):
        sets = khop_sets(bitcoin_graph, vertices, hops)
        for j in range(0, vertices.size, 7):
            expect = np.unique(fetcher.fetch([int(vertices[j])], hops).nodes)
            np.testing.assert_array_equal(sets.set_of(j), expect)


def test_stream_shares_one_set_per_vertex(bitcoin_graph):
    arrivals = np.arange(3000) * 0.01
    s = build_stream(bitcoin_graph, arrivals, 2)
    assert len(s) == 3000 and s.sets.vertices.size == np.unique(s.targets).size
    i = 1234
    np.testing.assert_array_equal(s.sets.vertices[s.set_index[i]], s.targets[i])
    assert s.vertex_set(i).size == s.sizes[i]


def test_chunks_cover_the_stream_in_whole_minutes(bitcoin_graph):
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 600, 5000))
    s = build_stream(bitcoin_graph, arrivals, 2)
    chunks = list(s.chunks(700))
    assert [lo for lo, _, _ in chunks] == list(np.cumsum([0] + [a.size for _, a, _ in chunks])[:-1])
    np.testing.assert_array_equal(np.concatenate([a for _, a, _ in chunks]), arrivals)
    np.testing.assert_array_equal(np.concatenate([r for _, _, r in chunks]), s.set_index)
    for (_, a, _), (_, b, _) in zip(chunks[:-1], chunks[1:], strict=True):
        assert a.size >= 700 and np.floor(a[-1] / 60) < np.floor(b[0] / 60)  # a minute apart
    assert s.size_stats() == (int(s.sizes.max()), int(s.sizes.sum()))


def test_a_repeated_stream_is_the_trace_played_again(bitcoin_graph):
    """Three repeats of a period equal the stream of the three periods' arrivals
    written out: the same times, targets going on along the request order."""
    period = np.sort(np.random.default_rng(1).uniform(0, 120, 900))
    s = build_stream(bitcoin_graph, period, 2, repeats=3, period_s=120.0)
    whole = build_stream(bitcoin_graph, np.concatenate([period + 120.0 * p for p in range(3)]), 2)
    assert len(s) == len(whole) == 2700
    got = list(s.chunks(250))
    np.testing.assert_array_equal(np.concatenate([a for _, a, _ in got]), whole.arrivals)
    rows = np.concatenate([r for _, _, r in got])
    np.testing.assert_array_equal(s.sets.vertices[rows], whole.targets)
    for i in (0, 899, 900, 1799, 2699):
        np.testing.assert_array_equal(s.vertex_set(i), whole.vertex_set(i))
    np.testing.assert_array_equal(s.arrivals_of(850, 1900), whole.arrivals[850:1900])
    assert s.size_stats() == (int(whole.sizes.max()), int(whole.sizes.sum()))

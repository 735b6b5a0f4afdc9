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

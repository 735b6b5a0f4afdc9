"""Graph sharing: a merged buffer equals the fetch of the union of its targets and
aggregates each (vertex, layer) once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.merge import merge_computation_graphs, node_levels
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph, write_graph

BITCOIN = Path(__file__).parents[2] / "gnn_faas" / "data" / "bitcoin_otc.npz"


def write_bitcoin_store(root: Path, dim: int = 8) -> tuple[str, int]:
    """Bitcoin OTC (the bundled SNAP file) as a graph store: ``u -> v`` (u rates
    v) makes ``v`` aggregate from ``u``; ids renumbered to ``0..n-1``."""
    d = np.load(BITCOIN, allow_pickle=False)
    ids, inv = np.unique(np.concatenate([d["src"], d["dst"]]), return_inverse=True)
    n = ids.size
    src, dst = inv[: d["src"].size], inv[d["src"].size :]
    order = np.lexsort((src, dst))
    indptr = np.concatenate(([0], np.cumsum(np.bincount(dst, minlength=n))))
    features = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    uri = f"file://{root}"
    write_graph(
        uri,
        "bitcoin-otc",
        indptr=indptr,
        indices=src[order],
        features=features,
        symmetrized=False,
        node_ids=ids,
    )
    return uri, n


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory) -> KHopFetcher:
    uri, _ = write_bitcoin_store(tmp_path_factory.mktemp("store"))
    return KHopFetcher(open_graph(uri, "bitcoin-otc"))


def request_stream(fetcher: KHopFetcher, count: int, seed: int) -> list[np.ndarray]:
    """Overlapping requests: consecutive windows of the real (time-ordered)
    rating stream's rated vertices, as a buffer would collect them."""
    d = np.load(BITCOIN, allow_pickle=False)
    ids = fetcher.graph.read_blob("node_ids")
    stream = np.searchsorted(ids, d["dst"][np.argsort(d["time"], kind="stable")])
    rng = np.random.default_rng(seed)
    start = int(rng.integers(0, stream.size - 200))
    sizes = rng.integers(1, 6, count)
    bounds = start + np.concatenate(([0], np.cumsum(sizes)))
    return [stream[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def layer_sets(cg) -> list[set[int]]:
    return [set(cg.nodes[:s].tolist()) for s in cg.layer_sizes]


def block_edges(cg, layer: int) -> set[tuple[int, int]]:
    """A block's adjacency as global ``(dst, src)`` pairs."""
    src, dst = cg.block(layer).edge_index()
    return set(zip(cg.nodes[dst].tolist(), cg.nodes[src].tolist(), strict=True))


@pytest.mark.parametrize("fanouts", [None, [10, 10], [10, 5, 3]])
def test_merge_equals_fetch_of_union(fetcher, fanouts):
    hops = 2 if fanouts is None else len(fanouts)
    requests = request_stream(fetcher, 12, seed=hops)
    cgs = [fetcher.fetch(t, hops, fanouts, seed=7, degrees=True) for t in requests]
    merged = merge_computation_graphs(cgs)
    union = fetcher.fetch(np.concatenate(requests), hops, fanouts, seed=7, degrees=True)
    g = merged.graph

    assert g.layer_sizes == union.layer_sizes
    assert layer_sets(g) == layer_sets(union)
    for layer in range(1, hops + 1):
        assert block_edges(g, layer) == block_edges(union, layer)
    # Same numbering as the fetcher, so identical arrays, degrees included.
    np.testing.assert_array_equal(g.nodes, union.nodes)
    np.testing.assert_array_equal(g.indptr, union.indptr)
    np.testing.assert_array_equal(g.indices, union.indices)
    np.testing.assert_array_equal(g.in_degree, union.in_degree)
    np.testing.assert_array_equal(g.target_index, union.target_index)


def test_each_vertex_layer_aggregated_once(fetcher):
    requests = request_stream(fetcher, 16, seed=3)
    cgs = [fetcher.fetch(t, 2) for t in requests]
    merged = merge_computation_graphs(cgs)

    union_rows = sum(
        len(set().union(*(s[layer] for s in map(layer_sets, cgs)))) for layer in (1, 2)
    )
    assert merged.merged_rows == union_rows == merged.graph.aggregated_rows()
    assert merged.separate_rows == sum(cg.aggregated_rows() for cg in cgs)
    assert merged.merged_rows <= merged.separate_rows
    # Requests from one stretch of the stream share neighbourhoods: real savings.
    assert merged.saved_rows > 0
    # Every D_l is a prefix and every block only reads the layer below.
    g = merged.graph
    assert all(a >= b for a, b in zip(g.layer_sizes, g.layer_sizes[1:], strict=False))
    for layer in (1, 2):
        block = g.block(layer)
        assert block.indices.size == 0 or block.indices.max() < block.num_src


def test_request_rows_point_at_each_requests_targets(fetcher):
    requests = request_stream(fetcher, 6, seed=5)
    requests[2] = np.concatenate([requests[2], requests[2][:1]])  # a repeated target
    cgs = [fetcher.fetch(t, 2, [5, 5]) for t in requests]
    merged = merge_computation_graphs(cgs)
    assert merged.num_requests == len(requests)
    for targets, rows in zip(requests, merged.request_rows, strict=True):
        np.testing.assert_array_equal(merged.graph.nodes[rows], targets)
        assert rows.max() < merged.graph.layer_sizes[-1]  # targets are D_L


def test_single_request_is_unchanged(fetcher):
    cg = fetcher.fetch(request_stream(fetcher, 1, seed=9)[0], 2, degrees=True)
    merged = merge_computation_graphs([cg])
    assert merged.merged_rows == merged.separate_rows == cg.aggregated_rows()
    np.testing.assert_array_equal(merged.graph.nodes, cg.nodes)
    np.testing.assert_array_equal(merged.graph.indices, cg.indices)


def test_node_levels(fetcher):
    cg = fetcher.fetch(request_stream(fetcher, 1, seed=1)[0], 3)
    levels = node_levels(cg)
    for layer, size in enumerate(cg.layer_sizes):
        assert np.all(levels[:size] >= layer)
        assert np.all(levels[size:] < layer)


def test_bad_input(fetcher):
    with pytest.raises(InvalidRequest):
        merge_computation_graphs([])
    a = fetcher.fetch([1, 2], 1)
    b = fetcher.fetch([1, 2], 2)
    with pytest.raises(InvalidRequest, match="depth"):
        merge_computation_graphs([a, b])

"""New-vertex requests: the k-hop computation graph with a request's added
vertices and edges equals PyG on the graph with them added, for every architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.memory_app import execute_aggregate, parse_aggregate
from gnn_faas.functions.pyg_models import csr_edge_index
from gnn_faas.storage.overlay import GraphOverlay, merge_segments
from tests.functions.test_composition import ARCHS, ATOL, RTOL, cora_fetcher, make_model


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory):
    return cora_fetcher(tmp_path_factory.mktemp("store"))


def new_request(fetcher, n=3, seed=0):
    """``n`` new vertices (noisy copies of real rows), each linked to a few stored
    vertices, plus one edge between two new vertices."""
    g = fetcher.graph
    N = g.num_nodes
    rng = np.random.default_rng(seed)
    base = fetcher.read_features(rng.choice(N, n, replace=False))
    feats = (base + (rng.random(base.shape) < 0.01)).astype(np.float32)
    edges = [[int(u), N + i] for i in range(n) for u in rng.choice(N, 3 + i, replace=False)]
    edges.append([N, N + 1])
    return feats, np.array(edges, dtype=np.int64)


def pyg_augmented(model, fetcher, feats, edges):
    """The PyG model on the stored graph with the new vertices and (symmetrised) edges."""
    g = fetcher.graph
    ei = csr_edge_index(g.read_blob("indptr"), g.read_blob("indices"))
    e = torch.from_numpy(edges.T.copy())
    ei = torch.cat((ei, e, e.flip(0)), dim=1)
    x = np.concatenate((np.asarray(g.read_blob("features"), np.float32), feats))
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x), ei).numpy()


@pytest.mark.parametrize("name", list(ARCHS))
def test_new_vertices_equal_pyg(name, fetcher, tmp_path):
    model, update = make_model(name, 2, fetcher, tmp_path)
    feats, edges = new_request(fetcher)
    N = fetcher.graph.num_nodes
    ov = GraphOverlay.build(N, feats, edges, symmetrize=True)
    # new vertices, and stored vertices whose neighbourhood the edges change
    targets = np.array([N, N + 2, N + 1, int(edges[0, 0]), 5, N])
    cg = fetcher.fetch(targets, 2, degrees=True, overlay=ov)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update, overlay=ov))
    ref = pyg_augmented(model, fetcher, feats, edges)
    np.testing.assert_allclose(out[cg.target_index], ref[targets], rtol=RTOL, atol=ATOL)
    # nothing was written: the store still has N vertices and its old answer
    assert fetcher.graph.num_nodes == N
    plain = fetcher.fetch([5], 2, degrees=True)
    assert not np.isin(plain.nodes, ov.new_ids).any()


def test_memory_function_aggregates_request_rows_and_stored_rows(fetcher):
    """The memory side's answer for a block with new sources equals the local one."""
    feats, edges = new_request(fetcher, seed=3)
    N = fetcher.graph.num_nodes
    ov = GraphOverlay.build(N, feats, edges, symmetrize=True)
    cg = fetcher.fetch([N, N + 1, 7], 2, degrees=True, overlay=ov)
    block = cg.block(1)
    src = cg.nodes[: block.num_src]
    new = src >= N
    tensors = {
        "indptr": block.indptr,
        "indices": block.indices,
        "src_ids": src,
        "deg_src": cg.in_degree[: block.num_src],
        "new_x": ov.rows(src[new]),
    }
    call = parse_aggregate(tensors, {"op": "gcn", "num_dst": block.num_dst})
    rows = fetcher.read_features(src, overlay=ov)
    got = execute_aggregate(call, rows)["agg"]
    from gnn_faas.functions.aggregate import aggregate

    ref = aggregate("gcn", block, rows, deg_src=cg.in_degree[: block.num_src])
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert call.new_x.shape == (int(new.sum()), rows.shape[1])


def test_overlay_in_edges_and_degrees(fetcher):
    N = fetcher.graph.num_nodes
    ov = GraphOverlay.build(N, np.zeros((2, 4), np.float32), np.array([[3, N], [N, N + 1]]), True)
    counts, src = ov.in_edges(np.array([N, N + 1, 3, 9]))
    assert counts.tolist() == [2, 1, 1, 0]
    assert sorted(src[:2].tolist()) == [3, N + 1] and src[2] == N and src[3] == N
    stored = fetcher.in_degrees(np.array([3]))[0]
    assert fetcher.in_degrees(np.array([3, N]), ov).tolist() == [stored + 1, 2]
    with pytest.raises(InvalidRequest, match="out of range"):
        fetcher.fetch([N + 2], 1, overlay=ov)
    with pytest.raises(InvalidRequest):
        GraphOverlay.build(N, np.zeros((1, 4), np.float32), np.array([[0, N + 1]]), True)


def test_merge_segments_keeps_owner_order():
    c, v = merge_segments(
        np.array([2, 0, 1]), np.array([1, 2, 3]), np.array([1, 1, 0]), np.array([9, 8])
    )
    assert c.tolist() == [3, 1, 1] and v.tolist() == [1, 2, 9, 8, 3]

"""Precomputed-embedding serving (SRPE): budget 1 equals exact serving, budget 0
equals reusing every neighbour's stored embedding, and the top query-edge-ratio
choice on a small graph checked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.checkpoint import checkpoint_sha256
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.precompute import precompute
from gnn_faas.functions.pyg_models import csr_edge_index
from gnn_faas.storage.embeddings import EmbeddingStore, StaleEmbeddings
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph, write_graph
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.recompute_policy import CandidateScores, budget_count, select_recomputed
from gnn_faas.storage.srpe_graph import build_srpe_graph
from tests.functions.test_composition import (
    ATOL,
    RTOL,
    cora_fetcher,
    looped_cora_fetcher,
    make_model,
)
from tests.storage.test_overlay import new_request


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory):
    return cora_fetcher(tmp_path_factory.mktemp("store"))


def augmented(fetcher, feats, edges):
    g = fetcher.graph
    ei = csr_edge_index(g.read_blob("indptr"), g.read_blob("indices"))
    e = torch.from_numpy(edges.T.copy())
    x = np.concatenate((np.asarray(g.read_blob("features"), np.float32), feats))
    return torch.from_numpy(x), torch.cat((ei, e, e.flip(0)), dim=1)


def reference(model, x, ei, stored_h: dict[int, np.ndarray], reuse: np.ndarray) -> np.ndarray:
    """The PyG model layer by layer; after layer ``l < L`` the rows ``reuse``
    (stored vertices) are replaced by their stored ``p^(l)``."""
    h = x
    with torch.no_grad():
        for i, conv in enumerate(model.eval().convs):
            h = conv(h, ei)
            if i < len(model.convs) - 1:
                h = torch.relu(h)
                h[reuse] = torch.from_numpy(stored_h[i + 1][reuse])
    return h.numpy()


def setup(name, layers, fetcher, tmp_path):
    model, update = make_model(name, layers, fetcher, tmp_path)
    precompute(fetcher.graph, tmp_path / "ckpt", "m")
    emb = EmbeddingStore.open(fetcher.graph, "m", checkpoint_sha256(tmp_path / "ckpt"))
    return model, update, emb


@pytest.mark.parametrize("name,layers", [("gcn", 2), ("sage-mean", 2), ("gat", 2), ("gin", 3)])
def test_budget_one_equals_exact_and_zero_reuses_stored(name, layers, fetcher, tmp_path):
    model, update, emb = setup(name, layers, fetcher, tmp_path)
    N = fetcher.graph.num_nodes
    feats, edges = new_request(fetcher, n=3, seed=1)
    ov = GraphOverlay.build(N, feats, edges, symmetrize=True)
    targets = np.array([N + 1, N, N + 2, N])
    exact_cg = fetcher.fetch(targets, layers, degrees=True, overlay=ov)
    exact = run_layers(update.plan, exact_cg, LocalTransport(fetcher, update, overlay=ov))
    exact = exact[exact_cg.target_index]
    stored = {k: emb.rows(k, np.arange(N)) for k in emb.layers}

    full = build_srpe_graph(fetcher, targets, layers, 1.0, overlay=ov)
    assert set(full.recomputed.tolist()) == set(full.candidates.ids.tolist())
    out = run_layers(update.plan, full, LocalTransport(fetcher, update, overlay=ov), emb.rows)
    np.testing.assert_allclose(out[full.target_index], exact, rtol=RTOL, atol=ATOL)

    none = build_srpe_graph(fetcher, targets, layers, 0.0, overlay=ov)
    assert none.recomputed.size == 0 and none.num_computed == 3
    out0 = run_layers(update.plan, none, LocalTransport(fetcher, update, overlay=ov), emb.rows)
    x, ei = augmented(fetcher, feats, edges)
    stored_pad = {
        k: np.concatenate((v, np.zeros((3, v.shape[1]), np.float32))) for k, v in stored.items()
    }
    ref0 = reference(model, x, ei, stored_pad, np.arange(N))  # every stored vertex reused
    np.testing.assert_allclose(out0[none.target_index], ref0[targets], rtol=RTOL, atol=ATOL)
    if name == "gcn":  # the new edges really change the candidates' embeddings
        assert not np.allclose(out0[none.target_index], exact, atol=1e-4)


@pytest.mark.parametrize("looped", [False, True], ids=["cora", "cora-self-loops"])
def test_stored_vertex_targets_are_exact_at_any_budget(looped, fetcher, tmp_path):
    if looped:  # precomputed and SRPE degrees must exclude self loops, as exact ones do
        fetcher = looped_cora_fetcher(fetcher)
    _, update, emb = setup("gcn", 2, fetcher, tmp_path)
    targets = np.array([10, 200, 10, 1500])
    cg = fetcher.fetch(targets, 2, degrees=True)
    exact = run_layers(update.plan, cg, LocalTransport(fetcher, update))[cg.target_index]
    sg = build_srpe_graph(fetcher, targets, 2, 0.0)
    out = run_layers(update.plan, sg, LocalTransport(fetcher, update), emb.rows)
    np.testing.assert_allclose(out[sg.target_index], exact, rtol=RTOL, atol=ATOL)


def test_stale_and_missing_embeddings_are_refused(fetcher, tmp_path, monkeypatch):
    _, update, emb = setup("gcn", 2, fetcher, tmp_path)
    with pytest.raises(StaleEmbeddings, match="precompute --model m'"):
        EmbeddingStore.open(fetcher.graph, "m", "0" * 64)
    # under `gnn-faas up --config FILE` the command names that config
    monkeypatch.setenv("GNN_FAAS_CONFIG", "/srv/my serving.yaml")
    with pytest.raises(
        StaleEmbeddings, match="precompute --model m --config '/srv/my serving.yaml'"
    ):
        EmbeddingStore.open(fetcher.graph, "m", "0" * 64)
    monkeypatch.delenv("GNN_FAAS_CONFIG")
    with pytest.raises(NotFound, match="precompute"):
        EmbeddingStore.open(fetcher.graph, "other", checkpoint_sha256(tmp_path / "ckpt"))
    # the CLI: a checkpoint directory, --graph and --store
    store = fetcher.graph.backend.uri
    args = [
        "precompute",
        "--model",
        str(tmp_path / "ckpt"),
        "--graph",
        "cora",
        "--store",
        store,
        "--name",
        "cli",
    ]
    assert main(args) == 0
    assert EmbeddingStore.open(
        fetcher.graph, "cli", checkpoint_sha256(tmp_path / "ckpt")
    ).layers == [1]
    assert main(["precompute", "--model", "no-such-model"]) == 2


def small_graph(tmp_path):
    """Six stored vertices (symmetrised): 0-1, 2-4, 2-5, 4-5, 3 isolated."""
    e = np.array([[0, 1], [2, 4], [2, 5], [4, 5]])
    src = np.concatenate((e[:, 0], e[:, 1]))
    dst = np.concatenate((e[:, 1], e[:, 0]))
    order = np.lexsort((src, dst))
    counts = np.bincount(dst, minlength=6)
    write_graph(
        f"file://{tmp_path}",
        "small",
        indptr=np.concatenate(([0], np.cumsum(counts))),
        indices=src[order],
        features=np.eye(6, 4, dtype=np.float32),
        symmetrized=True,
    )
    return KHopFetcher(open_graph(f"file://{tmp_path}", "small"))


def test_top_query_edge_ratio_by_hand(tmp_path):
    f = small_graph(tmp_path)
    # one new vertex 6 linked to 1, 2 and 3; vertex 0 is a stored query linked to 1
    ov = GraphOverlay.build(
        6, np.ones((1, 4), np.float32), np.array([[1, 6], [2, 6], [3, 6]]), True
    )
    sg = build_srpe_graph(f, np.array([6, 0]), 2, 1.0, overlay=ov)
    c = sg.candidates
    assert c.ids.tolist() == [1, 2, 3]
    # |N(u)| with the new edges: 1 <- {0, 6}, 2 <- {4, 5, 6}, 3 <- {6}
    assert c.degree.tolist() == [2, 3, 1]
    # |N_Q(u)| with Q = {6, 0}: 1 <- {0, 6}: 2; 2 <- {6}: 1; 3 <- {6}: 1
    assert c.query_edges.tolist() == [2, 1, 1]
    np.testing.assert_allclose(c.query_edge_ratio, [1.0, 1 / 3, 1.0])
    # importance: 6 reads {1, 2, 3} (1/3 each), 0 reads {1} (1)
    np.testing.assert_allclose(c.importance, [4 / 3, 1 / 3, 1 / 3])
    assert budget_count(0.34, 3) == 2 and budget_count(0.1, 30) == 3 and budget_count(0, 3) == 0
    # γ = 1/3: one candidate, the top ratio (1 and 3 tie at 1.0: the smaller id)
    sg = build_srpe_graph(f, np.array([6, 0]), 2, 1 / 3, overlay=ov)
    assert sg.recomputed.tolist() == [1]
    sg = build_srpe_graph(f, np.array([6, 0]), 2, 0.5, overlay=ov)
    assert sg.recomputed.tolist() == [1, 3]
    # the recomputed candidates' own in-neighbours join the boundary
    assert set(sg.boundary.tolist()) == {2}  # 1 <- {0, 6} (computed); 3 <- {6}; 6 <- 2
    assert select_recomputed(c, 0.34, "importance").tolist() == [1, 2]
    r1 = select_recomputed(c, 0.6, "random", seed=1)
    assert r1.size == 2 and r1.tolist() == select_recomputed(c, 0.6, "random", seed=1).tolist()
    with pytest.raises(InvalidRequest, match="policy"):
        select_recomputed(c, 0.5, "best")
    with pytest.raises(InvalidRequest, match="budget"):
        build_srpe_graph(f, np.array([0]), 2, 1.5)


def test_candidate_scores_ratio_guards_zero_degree():
    s = CandidateScores(np.array([1]), np.array([0.0]), np.array([0]), np.array([0.0]))
    assert s.query_edge_ratio.tolist() == [0.0]

"""SRPE's recomputation from stored aggregate states: the recomputed
candidates' layer 1 from their stored states plus the request's changed terms
equals their recomputation from the whole neighbourhood (and so, at budget 1,
exact serving), on Cora with and without self loops, for every op that keeps a
state; it reads far fewer rows."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.srpe_recompute import STATE_OPS, recompute_from_states
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.srpe_graph import build_srpe_graph
from tests.functions.test_composition import ATOL, RTOL, cora_fetcher, looped_cora_fetcher
from tests.storage.test_overlay import new_request
from tests.storage.test_srpe_graph import setup


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory):
    return cora_fetcher(tmp_path_factory.mktemp("store"))


def triangle_request(fetcher, seed: int = 0):
    """New vertices of :func:`new_request`, plus one linked to a stored vertex
    ``u`` and to two of ``u``'s neighbours: those neighbours' degrees change,
    which GCN's stored state of ``u`` must correct."""
    feats, edges = new_request(fetcher, n=3, seed=seed)
    n = fetcher.graph.num_nodes
    counts, nbrs = fetcher.neighbours(np.arange(n))
    u = int(np.flatnonzero(counts >= 3)[0])
    start = int(counts[:u].sum())
    vs = [int(v) for v in nbrs[start : start + counts[u]] if v != u][:2]
    extra = feats[:1] * 0.5
    new = n + feats.shape[0]
    more = np.array([[u, new], [vs[0], new], [vs[1], new]], np.int64)
    return np.concatenate((feats, extra)), np.concatenate((edges, more)), new


@pytest.mark.parametrize("looped", [False, True], ids=["cora", "cora-self-loops"])
@pytest.mark.parametrize("name", ["gcn", "sage-mean", "sage-max", "gin"])
def test_state_recomputation_equals_full_recomputation(name, looped, fetcher, tmp_path):
    if looped:
        fetcher = looped_cora_fetcher(fetcher)
    _, update, emb = setup(name, 2, fetcher, tmp_path)
    assert emb.has_states(1) and update.plan.steps[0].op in STATE_OPS
    n = fetcher.graph.num_nodes
    feats, edges, last = triangle_request(fetcher)
    ov = GraphOverlay.build(n, feats, edges, symmetrize=True)
    targets = np.array([n + 1, n, last, n + 2, n])
    exact_cg = fetcher.fetch(targets, 2, degrees=True, overlay=ov)
    tr = LocalTransport(fetcher, update, overlay=ov)
    exact = run_layers(update.plan, exact_cg, tr)[exact_cg.target_index]
    for budget in (1.0, 0.4):
        full = build_srpe_graph(fetcher, targets, 2, budget, overlay=ov)
        state = build_srpe_graph(fetcher, targets, 2, budget, overlay=ov, from_state=True)
        np.testing.assert_array_equal(full.recomputed, state.recomputed)
        assert state.delta is not None and state.delta.stored_count.size == state.recomputed.size
        want = run_layers(update.plan, full, tr, emb.rows)[full.target_index]
        got = run_layers(update.plan, state, tr, emb.rows, states=emb.state_rows)
        np.testing.assert_allclose(got[state.target_index], want, rtol=RTOL, atol=ATOL)
        if budget == 1.0:  # every candidate recomputed: exact serving
            np.testing.assert_allclose(got[state.target_index], exact, rtol=RTOL, atol=ATOL)
            corrected = (~state.delta.added).any()
        # the candidates' neighbourhoods are not read: fewer source rows
        assert state.nodes.size < full.nodes.size
    assert corrected  # stored neighbours whose degree the request changed were listed


@pytest.mark.parametrize("name", ["gcn", "sage-mean"])
def test_state_recomputation_with_directed_added_edges(name, fetcher, tmp_path):
    """Added edges in one direction only (an unsymmetrised overlay): a new
    vertex aggregates from some stored vertices and others aggregate from it."""
    _, update, emb = setup(name, 2, fetcher, tmp_path)
    n = fetcher.graph.num_nodes
    feats, edges, last = triangle_request(fetcher, seed=4)
    u, v0 = edges[-3, 0], edges[-2, 0]  # in-neighbours of `last`, v0 one of u's
    outs = np.array([[last, u], [last, v0]])  # u and v0 also aggregate from `last`
    ov = GraphOverlay.build(n, feats, np.concatenate((edges, outs)), symmetrize=False)
    targets = np.array([n, last, n + 1])
    tr = LocalTransport(fetcher, update, overlay=ov)
    exact_cg = fetcher.fetch(targets, 2, degrees=True, overlay=ov)
    exact = run_layers(update.plan, exact_cg, tr)[exact_cg.target_index]
    state = build_srpe_graph(fetcher, targets, 2, 1.0, overlay=ov, from_state=True)
    got = run_layers(update.plan, state, tr, emb.rows, states=emb.state_rows)
    np.testing.assert_allclose(got[state.target_index], exact, rtol=RTOL, atol=ATOL)
    assert state.delta.added.sum() >= 2  # u's and v0's added in-edges from `last`
    if name == "gcn":  # v0's degree changed: u's stored state is corrected for it
        assert (~state.delta.added).any()


def test_state_recomputation_refuses_what_it_cannot_do(fetcher, tmp_path):
    _, update, emb = setup("gcn", 2, fetcher, tmp_path)
    n = fetcher.graph.num_nodes
    feats, edges = new_request(fetcher, n=2, seed=3)
    ov = GraphOverlay.build(n, feats, edges, symmetrize=True)
    sg = build_srpe_graph(fetcher, np.array([n]), 2, 1.0, overlay=ov, from_state=True)
    tr = LocalTransport(fetcher, update, overlay=ov)
    with pytest.raises(InvalidRequest, match="stored states"):
        run_layers(update.plan, sg, tr, emb.rows)  # no states given
    with pytest.raises(InvalidRequest, match="2-layer"):
        build_srpe_graph(fetcher, np.array([n]), 3, 1.0, overlay=ov, from_state=True)
    with pytest.raises(InvalidRequest, match="cannot be recomputed"):
        recompute_from_states("gat", np.zeros((0, 4)), sg.delta, np.zeros((1, 4)), sg.in_degree, 1)
    (tmp_path / "gat").mkdir()
    _, gat, gat_emb = setup("gat", 2, fetcher, tmp_path / "gat")
    assert not gat_emb.has_states(1)  # attention keeps the full recomputation

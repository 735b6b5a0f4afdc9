"""Precomputed serving (OMEGA's SRPE) from stored states, end to end: ``gnn-faas
up`` with real function processes over HTTP on Cora.

A new-vertex request's recomputed candidates get their layer 1 from the
memory function, which reads their stored states (one row each) and adds the
request's changed terms: the served answers equal the in-process SRPE path
(``gnn-faas bench srpe``'s: ``build_srpe_graph(from_state=True)`` and
``run_layers`` with the states) for GCN, GraphSAGE (mean and max) and GIN at
two budgets, and exact serving at budget 1. A merged buffer builds one SRPE
graph, so each candidate's state is read once. Models whose stored set or
layer 1 keeps no state fall back to full neighbourhoods, say so, and still
answer as the in-process path does.
"""

from __future__ import annotations

import numpy as np
import pytest
import requests

from gnn_faas.client import new_vertex_request
from gnn_faas.functions.checkpoint import checkpoint_sha256
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.precompute import full_graph_embeddings, precompute
from gnn_faas.storage.embeddings import EmbeddingStore, write_embeddings
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.srpe_graph import build_srpe_graph
from tests.functions.test_composition import cora_fetcher, make_model
from tests.functions.test_srpe_recompute import triangle_request
from tests.gateway.test_gateway_e2e import burst, infer, output
from tests.storage.test_overlay import new_request

pytestmark = pytest.mark.slow
RTOL, ATOL = 1e-4, 1e-5
STATE_ARCHS = ("gcn", "sage-mean", "sage-max", "gin")
BUDGETS = (0.25, 1.0)


def model_name(arch: str, budget: float) -> str:
    return f"{arch}-{round(budget * 100)}"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One stack: every state arch at both budgets, GAT (no layer-1 state) and
    a GCN whose stored set holds no states, each with its embedding set."""
    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.stack import Stack

    root = tmp_path_factory.mktemp("srpe-serving")
    fetcher = cora_fetcher(root / "store")
    graph = fetcher.graph
    models, updates, ckpts = [], {}, {}
    for arch in (*STATE_ARCHS, "gat"):
        (root / arch).mkdir()
        _, updates[arch] = make_model(arch, 2, fetcher, root / arch)
        ckpts[arch] = root / arch / "ckpt"
    settings = [(a, b, a) for a in STATE_ARCHS for b in BUDGETS] + [("gat", 0.25, "gat")]
    for arch, budget, ckpt_of in settings:
        name = model_name(arch, budget)
        precompute(graph, ckpts[ckpt_of], name)
        models.append((name, arch, budget))
    # a set written before states existed: layer embeddings only
    layers = full_graph_embeddings(graph, UpdateModel.load(ckpts["gcn"], "cpu"))
    write_embeddings(graph, "gcn-nostate", checkpoint_sha256(ckpts["gcn"]), layers)
    models.append(("gcn-nostate", "gcn", 0.25))
    ckpts["gcn-nostate"] = ckpts["gcn"]
    config = {
        "store": f"file://{root / 'store'}",
        "gateway": {"admission": False},
        "platform": {
            "memory_function_mb": 256,
            "compute_function_mb": 512,
            "max_memory_instances": 1,
            "max_compute_instances": 1,
        },
        "models": [
            {
                "name": name, "graph": "cora", "dataset": "cora",
                "checkpoint": str(ckpts.get(name, ckpts[arch])), "embeddings": "precomputed",
                "recompute_budget": budget,
                # a long SLO holds buffers open: a burst merges behind the first request
                "slo_s": 20.0,
            }
            for name, arch, budget in models
        ],
    }  # fmt: skip
    shas = {arch: checkpoint_sha256(ckpt) for arch, ckpt in ckpts.items()}
    with Stack(config, ready_timeout_s=300) as stack:
        yield stack, fetcher, updates, shas, {name: (arch, budget) for name, arch, budget in models}


def in_process(fetcher, update, emb, targets, budget, ov, from_state: bool):
    """``bench srpe``'s serving path: the SRPE graph and the layers in process."""
    sg = build_srpe_graph(fetcher, targets, 2, budget, overlay=ov, from_state=from_state)
    tr = LocalTransport(fetcher, update, overlay=ov)
    out = run_layers(update.plan, sg, tr, emb.rows, states=emb.state_rows if from_state else None)
    return out[sg.target_index], sg


def exact(fetcher, update, targets, ov) -> np.ndarray:
    cg = fetcher.fetch(targets, 2, degrees=True, overlay=ov)
    return run_layers(update.plan, cg, LocalTransport(fetcher, update, overlay=ov))[cg.target_index]


def memory_state_rows(stack, name: str) -> int:
    status = stack.status()
    model = next(m for m in status["models"] if m["model"] == name)
    return sum(c.get("state_rows_read", 0) for c in model["caches"])


def requests_of(fetcher):
    """Two new-vertex requests: one whose new vertex links a stored vertex and
    two of its neighbours (GCN corrects their changed degrees), and one of
    three new vertices with stored targets beside them."""
    n = fetcher.graph.num_nodes
    feats, edges, last = triangle_request(fetcher, seed=5)
    f2, e2 = new_request(fetcher, n=3, seed=8)
    return [
        (np.array([last, n, n + 2, 17]), feats, edges),
        (np.array([n + 1, n, int(e2[0, 0]), 1200]), f2, e2),
    ]


def served_equal_in_process(stack, fetcher, update, emb, name, budget, source: str):
    """Serve each new-vertex request of :func:`requests_of` by model ``name``
    and check it against in-process SRPE recomputing from ``source``: the same
    scores, the same candidates recomputed, each recomputed candidate's state
    row read once from states and none from neighbourhoods. Yields, per
    request, its targets, overlay and served scores."""
    n = fetcher.graph.num_nodes
    for targets, feats, edges in requests_of(fetcher):
        ov = GraphOverlay.build(n, feats, edges, symmetrize=True)
        from_state = source == "state"
        want, sg = in_process(fetcher, update, emb, targets, budget, ov, from_state=from_state)
        before = memory_state_rows(stack, name)
        resp = infer(stack.url, new_vertex_request(targets, feats, edges), model=name)
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(output(resp, "scores"), want, RTOL, ATOL)
        params = resp.json()["parameters"]
        assert params["recompute_from"] == source
        assert params["recomputed"] == sg.recomputed.size > 0
        read = memory_state_rows(stack, name) - before
        assert read == (sg.recomputed.size if from_state else 0)
        yield targets, ov, want


@pytest.mark.parametrize("arch", STATE_ARCHS)
def test_served_state_recomputation_equals_in_process_srpe(served, arch):
    stack, fetcher, updates, shas, _ = served
    update = updates[arch]
    approximate = []
    for budget in BUDGETS:
        name = model_name(arch, budget)
        emb = EmbeddingStore.open(fetcher.graph, name, shas[arch])
        meta = requests.get(f"{stack.url}/v2/models/{name}", timeout=30).json()["parameters"]
        assert meta["recompute_from"] == "state" and "recompute_from_reason" not in meta
        served = served_equal_in_process(stack, fetcher, update, emb, name, budget, "state")
        for targets, ov, scores in served:
            ref = exact(fetcher, update, targets, ov)
            if budget == 1.0:  # every candidate recomputed: exact serving
                np.testing.assert_allclose(scores, ref, RTOL, ATOL)
            else:  # stale stored embeddings of the candidates not recomputed
                approximate.append(not np.allclose(scores, ref, RTOL, ATOL))
    assert any(approximate)


def test_merged_buffer_recomputes_each_candidate_once(served):
    """A burst of overlapping stored-vertex requests: each execution builds one
    SRPE graph of its requests' targets, so a candidate shared by them is
    recomputed (its state row read) once; stored vertices' answers are exact."""
    stack, fetcher, updates, _, _ = served
    name, update = model_name("gcn", 0.25), updates["gcn"]
    rng = np.random.default_rng(0)
    counts, nbrs = fetcher.neighbours(np.arange(fetcher.graph.num_nodes))
    starts = np.concatenate(([0], np.cumsum(counts)))
    hubs = rng.choice(np.flatnonzero(counts >= 4), 12, replace=False)
    # a hub and one of its neighbours: neighbourhoods overlap within and across requests
    batches = [[int(h), int(nbrs[starts[h]])] for h in hubs]
    before = memory_state_rows(stack, name)
    responses = burst(stack.url, batches, model=name)
    ref = exact(fetcher, update, np.unique(np.concatenate(batches)), None)
    order = np.unique(np.concatenate(batches))
    executions: dict[str, list] = {}
    for targets, resp in zip(batches, responses):
        assert resp.status_code == 200, resp.text
        want = ref[np.searchsorted(order, targets)]
        np.testing.assert_allclose(output(resp, "scores"), want, RTOL, ATOL)
        p = resp.json()["parameters"]
        assert p["recompute_from"] == "state"
        executions.setdefault(p["execution"], []).append((targets, p))
    assert any(len(reqs) > 1 for reqs in executions.values()), "no buffer merged requests"
    total = 0
    for reqs in executions.values():
        union = np.concatenate([t for t, _ in reqs])
        sg = build_srpe_graph(fetcher, union, 2, 0.25, from_state=True)
        alone = [build_srpe_graph(fetcher, np.array(t), 2, 0.25).recomputed for t, _ in reqs]
        assert all(p["recomputed"] == sg.recomputed.size for _, p in reqs)
        assert sg.recomputed.size <= sum(r.size for r in alone)
        total += sg.recomputed.size
    assert memory_state_rows(stack, name) - before == total > 0


@pytest.mark.parametrize(
    "name,reason", [("gat-25", "keeps no aggregate state"), ("gcn-nostate", "no layer-1 state")]
)
def test_models_without_states_fall_back_to_neighbourhoods(served, name, reason):
    stack, fetcher, updates, shas, settings = served
    arch, budget = settings[name]
    update = updates[arch]
    meta = requests.get(f"{stack.url}/v2/models/{name}", timeout=30).json()["parameters"]
    assert meta["recompute_from"] == "neighbourhood" and reason in meta["recompute_from_reason"]
    status = next(m for m in stack.status()["models"] if m["model"] == name)
    assert status["srpe"]["recompute_from"] == "neighbourhood"
    emb = EmbeddingStore.open(fetcher.graph, name, shas[arch])
    served = served_equal_in_process(stack, fetcher, update, emb, name, budget, "neighbourhood")
    assert len(list(served)) == len(requests_of(fetcher))

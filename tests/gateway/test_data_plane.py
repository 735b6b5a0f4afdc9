"""The data plane over real HTTP and function processes: new-vertex requests
and precomputed serving (SRPE) answer as PyG on the graph with the request's
vertices and edges added; a stale embedding set is refused at start."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_faas.client import vertex_request
from gnn_faas.config import ServingConfig, from_dict
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.precompute import precompute
from gnn_faas.functions.pyg_models import build_model, csr_edge_index
from gnn_faas.gateway.data_plane import DataPlane
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.embeddings import StaleEmbeddings
from gnn_faas.storage.workload_metrics import compute_and_store
from tests.gateway.test_gateway_e2e import infer, output

pytestmark = pytest.mark.slow
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(arch="gcn", in_dim=graph.manifest.feature_dim, hidden_dim=32, out_dim=2,
                      num_layers=2, num_classes=2, graph="bitcoin-otc")  # fmt: skip
    model = build_model(cfg, seed=3).eval()
    save_checkpoint(root / "ckpt", cfg, model.state_dict())
    precompute(graph, root / "ckpt", "srpe")
    compute_and_store(graph, [-1, -1])  # PSGS for the models' full neighbourhoods
    common = {"graph": "bitcoin-otc", "dataset": "bitcoin-otc", "checkpoint": str(root / "ckpt")}
    config = {
        "store": store,
        "platform": {"memory_function_mb": 256, "compute_function_mb": 512},
        "models": [
            {"name": "exact", **common},
            {"name": "srpe", "embeddings": "precomputed", "recompute_budget": 1.0, **common},
        ],
    }
    with Stack(config, ready_timeout_s=120) as stack:
        yield stack, model, graph, config, root


def augmented_reference(model, graph, feats, edges):
    ei = csr_edge_index(graph.read_blob("indptr"), graph.read_blob("indices"))
    e = np.asarray(edges, dtype=np.int64).reshape(-1, 2).T.copy()
    ei = torch.cat((ei, torch.from_numpy(e)), dim=1)  # bitcoin-otc is directed
    x = np.concatenate((np.asarray(graph.read_blob("features"), np.float32), feats))
    with torch.no_grad():
        return model(torch.from_numpy(x), ei).numpy()


@pytest.mark.parametrize("name", ["exact", "srpe"])
def test_new_vertex_request_equals_pyg(served, name):
    stack, model, graph, _, _ = served
    n = graph.num_nodes
    feats = (
        np.random.default_rng(0).standard_normal((2, graph.manifest.feature_dim)).astype(np.float32)
    )
    edges = [[1, n], [2, n], [n, 7], [n + 1, n], [35, n + 1]]
    body = vertex_request([n, n + 1, 7, 2])
    body["inputs"] += [
        {"name": "features", "datatype": "FP32", "shape": [2, feats.shape[1]],
         "data": feats.reshape(-1).tolist()},
        {"name": "edges", "datatype": "INT64", "shape": [5, 2], "data": edges},
    ]  # fmt: skip
    resp = infer(stack.url, body, model=name)
    assert resp.status_code == 200, resp.text
    ref = augmented_reference(model, graph, feats, edges)
    np.testing.assert_allclose(output(resp, "scores"), ref[[n, n + 1, 7, 2]], RTOL, ATOL)
    # nothing was written: a plain request for 7 still sees the stored graph only
    plain = infer(stack.url, vertex_request([7]), model=name)
    stored = augmented_reference(model, graph, np.zeros((0, feats.shape[1]), np.float32), [])
    np.testing.assert_allclose(output(plain, "scores"), stored[[7]], RTOL, ATOL)
    bad = dict(body, inputs=body["inputs"][:1] + [dict(body["inputs"][1], shape=[1, 256])])
    resp = infer(stack.url, bad, model=name)
    assert resp.status_code == 400 and "error" in resp.json()


def test_precomputed_burst_shares_buffers(served):
    stack, model, graph, _, _ = served
    ref = augmented_reference(
        model, graph, np.zeros((0, graph.manifest.feature_dim), np.float32), []
    )
    order = graph.read_blob("request_order")
    batches = [order[i : i + 2].tolist() for i in range(0, 24, 2)]
    psgs = graph.read_blob("psgs")
    for targets, resp in zip(batches, burst_model(stack.url, batches, "srpe")):
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(output(resp, "scores"), ref[targets], RTOL, ATOL)
        params = resp.json()["parameters"]
        assert params["update_device"] == "cpu"  # no GPU pool configured
        # instance time per function, inside the execution's own time
        assert min(params["aggregate_ms"], params["update_ms"]) > 0
        assert max(params["aggregate_ms"], params["update_ms"]) < params["latency_ms"]
        # the buffer's size predicted from PSGS before any fetch: at least this request's
        assert params["predicted_rows"] >= float(psgs[np.unique(targets)].sum()) - 1e-3


def burst_model(url, batches, model):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(batches)) as pool:
        return list(pool.map(lambda t: infer(url, vertex_request(t), model=model), batches))


def test_stale_embeddings_are_refused_at_start(served):
    _, _, graph, config, root = served
    cfg = from_dict(ServingConfig, {**config, "models": [config["models"][1]]})
    other = ModelConfig(arch="gcn", in_dim=graph.manifest.feature_dim, hidden_dim=32, out_dim=2,
                        num_layers=2, num_classes=2, graph="bitcoin-otc")  # fmt: skip
    save_checkpoint(root / "ckpt2", other, build_model(other, seed=4).state_dict())
    stale = from_dict(
        ServingConfig,
        {**config, "models": [{**config["models"][1], "checkpoint": str(root / "ckpt2")}]},
    )
    assert cfg.models[0].embeddings == "precomputed"
    with pytest.raises(StaleEmbeddings, match="precompute --model srpe"):
        DataPlane(stale, platform=object())

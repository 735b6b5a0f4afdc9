"""Updates while serving, end to end: ``gnn-faas up``, ``POST /v2/graphs/{g}/updates``,
answers equal to PyG on the changed graph (docs/architecture.md, section 7).

A stack serves Bitcoin OTC; batches add and remove edges, add vertices (with
edges to them), replace rows and remove a vertex. After each batch the
gateway's answers (for vertices the batch touched and their neighbours) must
equal PyG's on the graph the same operations give when applied to a plain edge
list, for each architecture and on each store; the answer names the version it
was computed on. After ``gnn-faas graph compact`` they still do. Writes need
the token (401 without, 403 with a wrong one: nothing applied); a bad batch is
a 400 naming the row, nothing applied; a removed vertex is a 404.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import requests

from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.traces.replay import vertex_request
from tests.pyg_reference import checkpoint_with_reference, pyg_outputs

pytestmark = pytest.mark.slow
TOKEN = "s3cret-token"
ATOL = 1e-5
ARCHS = {
    "gcn": {"arch": "gcn", "hidden_dim": 16, "out_dim": 2, "num_layers": 2, "num_classes": 2},
    "sage": {"arch": "sage", "hidden_dim": 16, "out_dim": 2, "num_layers": 2, "num_classes": 2},
    "gin": {"arch": "gin", "hidden_dim": 16, "out_dim": 2, "num_layers": 2, "num_classes": 2},
    "gat": {"arch": "gat", "hidden_dim": 16, "out_dim": 2, "num_layers": 2, "num_classes": 2},
}


class EdgeList:
    """The graph as an edge list and a row table: the reference the updates change."""

    def __init__(self, graph):
        ptr, idx = graph.read_blob("indptr"), graph.read_blob("indices")
        self.dst = np.repeat(np.arange(graph.num_nodes), np.diff(ptr))
        self.src = np.asarray(idx, np.int64)
        self.x = np.array(graph.read_blob("features"), np.float32)
        self.removed: set[int] = set()

    def add_vertices(self, rows):
        self.x = np.concatenate((self.x, np.asarray(rows, np.float32)))

    def add_edges(self, edges):
        e = np.asarray(edges, np.int64).reshape(-1, 2)
        self.src, self.dst = (
            np.concatenate((self.src, e[:, 0])),
            np.concatenate((self.dst, e[:, 1])),
        )

    def remove_edges(self, edges):
        e = np.asarray(edges, np.int64).reshape(-1, 2)
        gone = np.zeros(self.src.size, bool)
        for u, v in e.tolist():
            gone |= (self.src == u) & (self.dst == v)
        self.src, self.dst = self.src[~gone], self.dst[~gone]

    def set_rows(self, ids, rows):
        self.x[np.asarray(ids)] = np.asarray(rows, np.float32)

    def remove_vertex(self, v):
        self.removed.add(v)
        keep = (self.src != v) & (self.dst != v)
        self.src, self.dst = self.src[keep], self.dst[keep]

    def reference(self, ckpt):
        return pyg_outputs(ckpt, self.src, self.dst, self.x)


def update(url: str, graph: str, body: dict, token: str | None = TOKEN) -> requests.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return requests.post(f"{url}/v2/graphs/{graph}/updates", json=body, headers=headers, timeout=60)


def infer(url: str, model: str, targets) -> requests.Response:
    body = vertex_request([int(t) for t in targets])
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)


def scores(r: requests.Response) -> np.ndarray:
    out = {o["name"]: o for o in r.json()["outputs"]}["scores"]
    return np.asarray(out["data"], np.float64).reshape(out["shape"])


def stack_config(store: str, models: dict[str, str]) -> dict:
    return {
        "store": store,
        "gateway": {"admission": False},
        "graphs": {"write_token": TOKEN, "freshness_s": 0, "compact_share": 0},  # read-your-writes
        "platform": {"memory_function_mb": 256, "compute_function_mb": 512,
                     "max_memory_instances": 1, "max_compute_instances": 1},
        "models": [
            {"name": name, "graph": "bitcoin-otc", "dataset": "bitcoin-otc", "checkpoint": ckpt,
             "max_targets": 256, "mode": "no_sharing"}
            for name, ckpt in models.items()
        ],
    }  # fmt: skip


def check_answers(url, models, ref: EdgeList, targets, version: int) -> None:
    for name, ckpt in models.items():
        want = ref.reference(ckpt)
        r = infer(url, name, targets)
        assert r.status_code == 200, r.text
        assert r.json()["parameters"]["graph_version"] == version
        np.testing.assert_allclose(scores(r), want[targets], rtol=1e-4, atol=ATOL, err_msg=name)


def run_updates(url: str, models: dict, graph, store: str) -> None:
    ref = EdgeList(graph)
    n = graph.num_nodes
    rng = np.random.default_rng(0)
    order = graph.read_blob("request_order")
    hot = [int(v) for v in order[:20]]
    # a batch of every kind but removal
    new_rows = rng.standard_normal((2, graph.manifest.feature_dim)).astype(np.float32)
    add = [[hot[0], n], [n + 1, hot[1]], [hot[2], hot[3]], [n, n + 1]]
    present = list(zip(ref.src[ref.dst == hot[4]].tolist(), [hot[4]] * 99))[:2]
    batch = {
        "add_vertices": {"features": new_rows.tolist()},
        "add_edges": add,
        "remove_edges": [list(e) for e in present],
        "set_features": {"ids": [hot[5]], "features": rng.standard_normal((1, 128)).tolist()},
    }
    r = update(url, "bitcoin-otc", batch)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["version"] == 1 and doc["new_ids"] == [n, n + 1]
    ref.add_vertices(new_rows)
    ref.add_edges(add)
    ref.remove_edges(present)
    ref.set_rows([hot[5]], batch["set_features"]["features"])
    targets = sorted({*hot[:6], n, n + 1, hot[4]})
    check_answers(url, models, ref, targets, 1)  # read-your-writes: this gateway, next request
    # remove a vertex: its edges go, inference on it is a 404
    r = update(url, "bitcoin-otc", {"remove_vertices": [hot[6]]})
    assert r.status_code == 200, r.text
    ref.remove_vertex(hot[6])
    gone = infer(url, next(iter(models)), [hot[6]])
    assert gone.status_code == 404 and "removed" in gone.json()["error"]
    near = sorted(set(ref.dst[np.isin(ref.src, hot[:10])].tolist()) - ref.removed)[:20]
    check_answers(url, models, ref, sorted({*hot[:6], *near} - ref.removed), 2)
    # compaction folds the log into a new base; answers stay the same, a new version
    done = subprocess.run(
        [sys.executable, "-m", "gnn_faas", "graph", "compact", "--store", store, "--graph",
         "bitcoin-otc", "--json"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for _ in range(100):  # the gateway finds it within freshness_s (polled)
        info = requests.get(f"{url}/v2/graphs/bitcoin-otc", timeout=10).json()
        if info["version"] == 3:
            break
        time.sleep(0.1)
    assert info["version"] == 3 and info["base_version"] == 2 and info["delta"]["segments"] == 0
    check_answers(url, models, ref, sorted({*hot[:6], *near} - ref.removed), 3)


@pytest.fixture(scope="module")
def file_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("updates")
    return root, f"file://{root / 'store'}"


def test_updates_are_exact_for_every_architecture(file_store):
    root, store = file_store
    graph = ensure_dataset(store, "bitcoin-otc")
    models = {}
    for name, cfg in ARCHS.items():
        checkpoint_with_reference(graph, root / name, seed=1, **cfg)
        models[name] = str(root / name)
    with Stack(stack_config(store, models), ready_timeout_s=180) as stack:
        run_updates(stack.url, models, graph, store)


@pytest.mark.parametrize("kind", ["s3", "redis"])
def test_updates_are_exact_on_remote_stores(kind, request, tmp_path):
    if kind == "s3":
        store = f"{request.getfixturevalue('s3_env')}/updates-{tmp_path.name}"
    else:
        store = f"{request.getfixturevalue('redis_url')}?prefix=updates-{tmp_path.name}/"
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, tmp_path / "gcn", seed=2, **ARCHS["gcn"])
    models = {"gcn": str(tmp_path / "gcn")}
    with Stack(stack_config(store, models), ready_timeout_s=180) as stack:
        run_updates(stack.url, models, graph, store)


def test_writes_need_the_token_and_bad_batches_change_nothing(file_store):
    root, store = file_store
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, root / "auth", seed=3, **ARCHS["gcn"])
    with Stack(stack_config(store, {"m": str(root / "auth")}), ready_timeout_s=180) as stack:
        before = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()["version"]
        body = {"add_edges": [[1, 2]]}
        r = update(stack.url, "bitcoin-otc", body, token=None)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        r = update(stack.url, "bitcoin-otc", body, token="wrong")
        assert r.status_code == 403 and "token" in r.json()["error"]
        for bad, message in (
            ({"add_edges": [[1, 2], [3, 10**9]]}, "add_edges row 1: unknown vertex id"),
            ({"add_vertices": {"features": [[1.0, 2.0]]}}, "new_features row 0: 2 values"),
            ({"set_features": {"ids": [1], "features": [[float("nan")] * 128]}}, "NaN"),
            ({"bogus": 1}, "unknown update field"),
        ):
            r = requests.post(
                f"{stack.url}/v2/graphs/bitcoin-otc/updates",
                data=json.dumps(bad),
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                timeout=30,
            )
            assert r.status_code == 400 and message in r.json()["error"], r.text
        after = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()
        assert after["version"] == before  # nothing applied
        assert requests.get(f"{stack.url}/v2/graphs/nope", timeout=10).status_code == 404
        # large batches as OIP tensors, binary
        edges = np.array([[1, 2], [2, 3]], np.int64)
        head = {"inputs": [{"name": "add_edges", "datatype": "INT64", "shape": [2, 2],
                            "parameters": {"binary_data_size": edges.nbytes}}]}  # fmt: skip
        raw = json.dumps(head).encode()
        binary = {
            "Authorization": f"Bearer {TOKEN}",
            "Inference-Header-Content-Length": str(len(raw)),
            "Content-Type": "application/octet-stream",
        }
        url = f"{stack.url}/v2/graphs/bitcoin-otc/updates"
        r = requests.post(url, data=raw + edges.tobytes(), headers=binary, timeout=30)
        assert r.status_code == 200 and r.json()["applied"]["added_edges"] == 2, r.text
        # a declared length is answered by the front's dispatcher, a chunked body by
        # the Flask view (gnn_faas/http.py): the same batch, the same answer
        chunked = requests.post(url, data=iter([raw, edges.tobytes()]), headers=binary, timeout=30)
        assert chunked.status_code == 200, chunked.text
        assert chunked.json()["version"] == r.json()["version"] + 1
        assert chunked.json()["applied"] == r.json()["applied"]
        no_token = {k: v for k, v in binary.items() if k != "Authorization"}
        r = requests.post(url, data=iter([raw]), headers=no_token, timeout=30)
        assert r.status_code == 401  # no token: refused on this path too


def test_precomputed_embeddings_are_never_stale_after_updates(tmp_path):
    """SRPE at a small budget: vertices within a hop of a change are recomputed
    (their stored embeddings are stale), so answers equal PyG on the changed
    graph, before and after compaction; --refresh clears the marks."""
    store = f"file://{tmp_path / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, tmp_path / "srpe", seed=4, **ARCHS["gcn"])
    ckpt = str(tmp_path / "srpe")
    pre = [sys.executable, "-m", "gnn_faas", "precompute", "--model", ckpt, "--graph",
           "bitcoin-otc", "--store", store, "--name", "srpe"]  # fmt: skip
    assert subprocess.run(pre, capture_output=True, timeout=300).returncode == 0
    config = stack_config(store, {"srpe": ckpt})
    config["models"][0].update(embeddings="precomputed", recompute_budget=0.05)
    ref = EdgeList(graph)
    order = graph.read_blob("request_order")
    hot = [int(v) for v in order[:10]]
    with Stack(config, ready_timeout_s=180) as stack:
        rows = np.random.default_rng(5).standard_normal((1, 128))
        batch = {"set_features": {"ids": [hot[0]], "features": rows.tolist()},
                 "add_edges": [[hot[1], hot[2]]]}  # fmt: skip
        assert update(stack.url, "bitcoin-otc", batch).status_code == 200
        ref.set_rows([hot[0]], rows)
        ref.add_edges([[hot[1], hot[2]]])
        # queries one hop downstream of the changed vertices: their stored
        # neighbours' embeddings are stale and must be recomputed
        downstream = sorted(set(ref.dst[np.isin(ref.src, hot[:3])].tolist()))[:12]
        want = ref.reference(ckpt)
        r = infer(stack.url, "srpe", downstream)
        assert r.status_code == 200, r.text
        assert r.json()["parameters"]["stale_recomputed"] > 0
        np.testing.assert_allclose(scores(r), want[downstream], rtol=1e-4, atol=ATOL)
        done = subprocess.run(
            [sys.executable, "-m", "gnn_faas", "graph", "compact", "--store", store,
             "--graph", "bitcoin-otc"], capture_output=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0
        for _ in range(100):
            if (
                requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()["version"]
                == 2
            ):
                break
            time.sleep(0.1)
        r = infer(stack.url, "srpe", downstream)  # on the compacted base: the marks
        assert r.status_code == 200, r.text + stack.log_tail(40)
        assert r.json()["parameters"]["stale_recomputed"] > 0
        np.testing.assert_allclose(scores(r), want[downstream], rtol=1e-4, atol=ATOL)
    manifest = tmp_path / "store" / "bitcoin-otc" / "embeddings" / "srpe" / "manifest.json"
    assert json.loads(manifest.read_text())["stale"]  # marked by the compaction
    assert subprocess.run([*pre, "--refresh"], capture_output=True, timeout=300).returncode == 0
    assert json.loads(manifest.read_text())["stale"] == []


def test_the_gateway_compacts_when_the_log_passes_its_share(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, tmp_path / "auto", seed=6, **ARCHS["gcn"])
    config = stack_config(store, {"auto": str(tmp_path / "auto")})
    config["graphs"].update(compact_share=1e-9, compaction_grace_s=0)
    ref = EdgeList(graph)
    hot = [int(v) for v in graph.read_blob("request_order")[:4]]
    with Stack(config, ready_timeout_s=180) as stack:
        assert (
            update(stack.url, "bitcoin-otc", {"add_edges": [[hot[0], hot[1]]]}).status_code == 200
        )
        ref.add_edges([[hot[0], hot[1]]])
        for _ in range(300):  # the background compaction publishes a version on a new base
            info = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()
            if info["base_version"] >= 1 and not info["compacting"]:
                break
            time.sleep(0.1)
        assert info["base_version"] == 1 and info["last_compaction"]["version"] == 1
        metrics = requests.get(f"{stack.url}/metrics", timeout=10).text
        assert 'gnn_faas_graph_compactions_total{graph="bitcoin-otc",outcome="done"} 1.0' in metrics
        check_answers(stack.url, {"auto": str(tmp_path / "auto")}, ref, hot, info["version"])

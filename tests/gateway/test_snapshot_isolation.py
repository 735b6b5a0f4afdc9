"""A request runs on one graph version from parse to answer, whatever commits meanwhile.

An in-process data plane (real function processes) serves a GCN. A request is
parsed on version 1; before its execution starts, a batch that changes the rows
and edges it reads commits version 2, and a second request (on version 2) has
already made the memory function learn version 2. The first answer must still
be version 1's, equal to PyG on the graph at version 1; the second equals PyG at
version 2. The memory function dropped exactly the rows version 2 set from its
cache (those resident, no others).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests

from gnn_faas.config import ServingConfig, from_dict
from gnn_faas.gateway.data_plane import DataPlane
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.traces.replay import vertex_request
from tests.pyg_reference import checkpoint_with_reference, pyg_outputs

pytestmark = pytest.mark.slow
GCN = {"arch": "gcn", "hidden_dim": 16, "out_dim": 2, "num_layers": 2, "num_classes": 2}


def start_plane(root, mode: str, seed: int):
    """A data plane serving a GCN on Bitcoin OTC in ``mode`` (real function
    processes, updates allowed, read-your-writes), ready: ``(plane, graph, ckpt)``."""
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, root / "ckpt", seed=seed, **GCN)
    config = from_dict(
        ServingConfig,
        {
            "store": store,
            "gateway": {"admission": False},
            "graphs": {"write_token": "t", "freshness_s": 0, "compact_share": 0},
            "platform": {"memory_function_mb": 256, "compute_function_mb": 512,
                         "max_memory_instances": 1, "max_compute_instances": 1},
            "models": [{"name": "m", "graph": "bitcoin-otc", "dataset": "bitcoin-otc",
                        "checkpoint": str(root / "ckpt"), "mode": mode}],
        },
    )  # fmt: skip
    dp = DataPlane(config)
    dp.start()
    deadline = time.monotonic() + 120
    while not dp.ready():  # polled: the function processes start
        assert time.monotonic() < deadline, "functions not ready"
        time.sleep(0.2)
    return dp, graph, root / "ckpt"


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    dp, graph, ckpt = start_plane(tmp_path_factory.mktemp("isolation"), "no_sharing", seed=9)
    yield dp, graph, ckpt
    dp.shutdown()


def edge_list(graph):
    ptr, idx = graph.read_blob("indptr"), graph.read_blob("indices")
    return np.asarray(idx, np.int64), np.repeat(np.arange(graph.num_nodes), np.diff(ptr))


def answer(result) -> tuple[np.ndarray, int]:
    return np.asarray(dict(result.outputs)["scores"]), result.parameters["graph_version"]


def test_a_request_answers_on_the_version_it_arrived_on(plane, monkeypatch):
    dp, graph, ckpt = plane
    rt = dp.models["m"]
    src, dst = edge_list(graph)
    x = np.array(graph.read_blob("features"), np.float32)
    targets = [int(t) for t in graph.read_blob("request_order")[:4]]
    reads = np.unique(src[np.isin(dst, targets)])  # rows layer 1 reads
    # warm the memory function's cache with what these requests read
    rt.infer(vertex_request(targets))
    v1 = rt.versions.state.version
    changed_rows = reads[:3]
    new_rows = np.full((changed_rows.size, x.shape[1]), 3.0, np.float32)
    batch = {"set_features": {"ids": changed_rows.tolist(), "features": new_rows.tolist()},
             "add_edges": [[int(reads[-1]), targets[0]]]}  # fmt: skip
    committed = {}
    run = rt.executions.run_separately

    def commit_then_run(pendings, info):
        # the request was parsed on v1; v2 commits before its execution starts, and
        # a request on v2 reaches the memory function first (it learns v2)
        if not committed:
            committed["rec"] = dp.updates.update(
                "bitcoin-otc", json.dumps(batch).encode(), "Bearer t"
            )
            committed["second"] = rt.infer(vertex_request(targets))
        return run(pendings, info)

    monkeypatch.setattr(rt.executions, "run_separately", commit_then_run)
    first = rt.infer(vertex_request(targets))
    monkeypatch.undo()
    got1, version1 = answer(first)
    got2, version2 = answer(committed["second"])
    assert version1 == v1 and version2 == committed["rec"]["version"] == v1 + 1
    want1 = pyg_outputs(ckpt, src, dst, x)[targets]
    x2 = x.copy()
    x2[changed_rows] = new_rows
    want2 = pyg_outputs(ckpt, np.append(src, reads[-1]), np.append(dst, targets[0]), x2)[targets]
    np.testing.assert_allclose(got1, want1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got2, want2, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want1, want2)  # the batch did change these answers
    # the memory function dropped exactly the rows v2 set (they were cached), no others
    stats = [requests.get(f"{i.url}/v1/stats", timeout=10).json()
             for i in rt.memory_pool.instances()]  # fmt: skip
    assert sum(s["cache"]["invalidations"] for s in stats) == changed_rows.size
    assert all(s["graph_versions"]["known_version"] == v1 + 1 for s in stats)


def memory_stats(rt) -> list[dict]:
    return [requests.get(f"{i.url}/v1/stats", timeout=10).json()["graph_versions"]
            for i in rt.memory_pool.instances()]  # fmt: skip


def current_graph(state, graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(src, dst, x)`` of the graph at ``state``, as the gateway's state holds it."""
    n = state.num_nodes
    counts, nbrs = state.in_lists(np.arange(n))
    x = np.array(graph.read_blob("features"), np.float32)
    if state.features.feat_ids.size:
        x[state.features.feat_ids] = state.features.feat_rows
    return nbrs, np.repeat(np.arange(n), counts), x


def test_a_version_that_changes_only_edges_costs_memory_functions_no_read(plane):
    """Its rows are its rows version's (graph_version.rows): the memory function
    answers it exactly without reading its segment (read behind the calls once
    they lag); a version that sets a row is read by the call that needs it."""
    dp, graph, ckpt = plane
    rt = dp.models["m"]
    targets = [int(t) for t in graph.read_blob("request_order")[4:8]]
    rt.infer(vertex_request(targets))  # the memory function knows the newest rows
    before = memory_stats(rt)
    rows_version = rt.versions.state.rows_version
    far = [int(v) for v in graph.read_blob("request_order")[-len(targets) :]]
    batch = {"add_edges": [[u, t] for u, t in zip(far, targets)]}
    rec = dp.updates.update("bitcoin-otc", json.dumps(batch).encode(), "Bearer t")
    got, version = answer(rt.infer(vertex_request(targets)))
    state = rt.versions.state
    assert version == rec["version"] == state.version > rows_version == state.rows_version
    # the call did not read the segment (a lag of one version is left for later)
    after = memory_stats(rt)
    on_calls = [s["segments_read_on_calls"] for s in after]
    assert on_calls == [s["segments_read_on_calls"] for s in before]
    assert [s["known_version"] for s in after] == [s["known_version"] for s in before]
    src, dst, x = current_graph(state, graph)
    want = pyg_outputs(ckpt, src, dst, x)[targets]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # the new edges did change these answers: they were served on the new structure
    m = state.num_nodes + 1
    keep = ~np.isin(dst * m + src, np.array(targets) * m + np.array(far))
    assert keep.sum() == src.size - len(far)
    assert not np.allclose(pyg_outputs(ckpt, src[keep], dst[keep], x)[targets], want)
    # a row set: the next call reads that version
    row = {"set_features": {"ids": [far[0]], "features": [[2.0] * x.shape[1]]}}
    rec2 = dp.updates.update("bitcoin-otc", json.dumps(row).encode(), "Bearer t")
    rt.infer(vertex_request(targets))
    stats = memory_stats(rt)
    assert all(s["known_version"] == rec2["version"] for s in stats)
    # the edge-only version left behind and the row-setting one, read by the call
    assert [s["segments_read_on_calls"] for s in stats] == [n + 2 for n in on_calls]

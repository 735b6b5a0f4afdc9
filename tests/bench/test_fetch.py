"""``gnn-faas bench fetch`` on real graphs: invariants of its figures, no timing asserts."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import scipy.sparse as sp

from gnn_faas.bench import fetch
from gnn_faas.cli import main
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.ranges import MAX_OVERREAD
from gnn_faas.storage.request_cost import STORE_KEY, RequestCost, document

KEYS = {
    "bytes_read", "bytes_min", "ratio", "round_trips_per_hop", "feature_round_trips",
    "p50_ms", "p99_ms", "full_download_bytes", "full_download_ms", "queries", "backend",
    "graph", "hops", "fanout", "requests_per_query", "dollars_per_million_queries",
    "bytes_min_definition", "ordering", "max_bytes_ratio",
}  # fmt: skip


def save_constants(uri: str, per_request_s: float, per_byte_s: float) -> None:
    """Planner constants saved in the store (what ``bench storage-constants --save`` does)."""
    cost = RequestCost("file", per_request_s, per_byte_s, 0.0, {"command": "test"})
    with open_backend(uri) as b:
        b.pipe_file(STORE_KEY, json.dumps(document({"file": cost})).encode())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A store whose requests are free: the planner reads exactly what is needed."""
    uri = f"file://{tmp_path_factory.mktemp('store')}"
    prepare_dataset(uri, "bitcoin-otc", feature_dim=16)
    prepare_dataset(uri, "cora")
    save_constants(uri, 0.0, 1e-9)
    return uri


@pytest.fixture(scope="module")
def costly_store(tmp_path_factory) -> str:
    """A store where a request costs as much as 10 MB (S3-like): whole blobs per read."""
    uri = f"file://{tmp_path_factory.mktemp('costly')}"
    prepare_dataset(uri, "bitcoin-otc", feature_dim=16)
    save_constants(uri, 0.01, 1e-9)
    return uri


def bench(store: str, graph: str, **kw) -> dict:
    args = argparse.Namespace(
        store=store, graph=graph, hops=2, fanout=None, queries=30, seed=0, repeats=2, prices=None
    )
    for k, v in kw.items():
        setattr(args, k, v)
    return fetch.run(args)


def test_full_neighbourhoods_on_bitcoin_otc(store):
    r = bench(store, "bitcoin-otc")
    assert set(r) >= KEYS
    assert (r["backend"], r["graph"], r["queries"], r["targets"]) == (
        "file", "bitcoin-otc", 30, "request_order",
    )  # fmt: skip
    assert r["bytes_min"] > 0 and r["bytes_read"] >= r["bytes_min"]
    assert r["ratio"] == pytest.approx(r["bytes_read"] / r["bytes_min"]) and r["ratio"] <= 1.10
    assert 0 < r["round_trips_per_hop"] <= 2 and r["feature_round_trips"] == 1
    assert 0 < r["p50_ms"] <= r["p99_ms"]
    backend = open_backend(store)
    # every blob and the manifest; the chunk digests are ours, a full download needs none
    blobs = [k for k in backend.ls("bitcoin-otc/") if not k.endswith(".chunks")]
    assert r["full_download_bytes"] == sum(backend.size(k) for k in blobs)
    assert r["requests_per_query"] == r["ranges_requested"] / r["queries"]
    assert r["dollars_per_million_queries"] is None  # a file is not billed per request


def test_costly_requests_are_merged_within_the_byte_budget(costly_store, store, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "prices:\n  disk:\n    kind: storage\n    scheme: file\n    get_per_thousand: 0.5\n"
        "    put_per_thousand: 1\n    source: https://example.org\n    date: '2026-11-25'\n"
    )
    r = bench(costly_store, "bitcoin-otc", prices=str(prices))
    # requests cost as much as 10 MB: gaps are merged as far as each query's
    # fetch-wide byte budget allows: (1 + MAX_OVERREAD) x its needed bytes
    assert r["max_bytes_ratio"] == 1 + MAX_OVERREAD and r["ordering"] == "none"
    assert r["bytes_min"] <= r["bytes_read"] <= (1 + MAX_OVERREAD) * r["bytes_min"]
    # against requests that cost nothing (only touching ranges merge): far fewer
    plain = bench(store, "bitcoin-otc")
    assert r["requests_per_query"] < 0.5 * plain["requests_per_query"]
    # each request at $0.5 per 1,000
    assert r["dollars_per_million_queries"] == pytest.approx(r["requests_per_query"] * 500.0)
    assert r["storage_price"] == "disk" and r["planner"]["max_gap_bytes"] == pytest.approx(1e7)


def test_sampled_neighbourhoods_read_less(store):
    full = bench(store, "bitcoin-otc")
    sampled = bench(store, "bitcoin-otc", fanout="5,3")
    assert sampled["fanout"] == [5, 3]
    assert sampled["bytes_read"] >= sampled["bytes_min"] and sampled["ratio"] <= 1.10
    assert sampled["bytes_min"] < full["bytes_min"]
    assert sampled["vertices_per_query"] <= 1 + 5 + 5 * 3


def test_bytes_min_matches_a_scipy_reference(store):
    """The exact need of a 2-hop query, from powers of (A + I) built by scipy."""
    g = open_graph(store, "cora")
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    n = g.num_nodes
    a = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(n, n))
    m = (a + sp.identity(n, format="csr")).tocsr()
    row_bytes = g.info("features").row_bytes
    for t in [0, 7, 1358, 2707]:
        hop1 = m[t]
        expanded = hop1.indices  # t and its in-neighbours: expanded by the two hops
        inputs = (hop1 @ m).indices  # D_0
        entries = np.unique(np.r_[expanded, expanded + 1]).size
        want = 8 * entries + 4 * int(a[expanded].nnz) + row_bytes * inputs.size
        assert fetch.min_bytes(indptr, indices, t, 2, None, 0, row_bytes) == want


def test_graph_without_request_order_uses_a_seeded_sample(store):
    a = bench(store, "cora", queries=10, seed=3)
    b = bench(store, "cora", queries=10, seed=3)
    assert a["targets"] == "sample" and a["bytes_min"] == b["bytes_min"]
    assert a["bytes_read"] >= a["bytes_min"] and a["ratio"] <= 1.10


def test_cli_prints_one_json_object(store, capsys):
    argv = ["bench", "fetch", "--store", store, "--graph", "bitcoin-otc", "--queries", "5"]
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and set(json.loads(out)) >= KEYS


@pytest.mark.parametrize(
    "extra,expect",
    [
        (["--graph", "absent"], "datasets prepare absent"),
        (["--graph", "cora", "--fanout", "10"], "one value per hop"),
        (["--graph", "cora", "--fanout", "a,b"], "integers"),
        (["--graph", "cora", "--queries", "0"], "positive"),
    ],
)
def test_cli_errors(store, capsys, extra, expect):
    assert main(["bench", "fetch", "--store", store, *extra]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1


def test_a_renumbered_graph_needs_fewer_requests_for_the_same_queries(costly_store, tmp_path):
    # the same dataset, request order and budget, stored in bfs order
    uri = f"file://{tmp_path}"
    prepare_dataset(uri, "bitcoin-otc", feature_dim=16, reorder="bfs")
    save_constants(uri, 0.01, 1e-9)
    plain = bench(costly_store, "bitcoin-otc")
    bfs = bench(uri, "bitcoin-otc")
    assert bfs["ordering"] == "bfs" and bfs["targets"] == plain["targets"] == "request_order"
    # the same neighbourhoods (the minimum bytes differ only by the indptr
    # entries that neighbouring ids share)
    assert bfs["vertices_per_query"] == plain["vertices_per_query"]
    assert bfs["bytes_read"] <= 2 * bfs["bytes_min"]
    assert bfs["requests_per_query"] < 0.5 * plain["requests_per_query"]

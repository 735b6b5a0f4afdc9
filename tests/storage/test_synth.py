"""The synthetic-graph generator on ``--scale`` versions of the benchmark shapes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.format import list_graphs, open_graph, write_graph
from gnn_faas.storage.synth import LIKES, plan_shape, synthesize


def _store(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'store'}"


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gnn_faas", *args], capture_output=True, text=True, **kw
    )


def test_exact_counts_and_a_valid_csr(tmp_path):
    store = _store(tmp_path)
    res = synthesize(store, "higgs-twitter", scale=0.01, seed=3)
    spec = LIKES["higgs-twitter"]
    n, m = round(spec.num_nodes * 0.01), round(spec.num_edges * 0.01)
    g = open_graph(store, "higgs-twitter-like", verify="full")  # every sha256 checked
    assert (g.num_nodes, g.num_edges, g.manifest.feature_dim) == (n, m, 300)
    assert res.summary()["bytes"] == sum(b.nbytes for b in g.manifest.blobs.values())
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices").astype(np.int64)
    assert indptr[0] == 0 and indptr[-1] == m == indices.size
    rows = np.repeat(np.arange(n), np.diff(indptr))
    keys = rows * n + indices
    assert np.all(np.diff(keys) > 0)  # rows sorted, no duplicate edge
    assert not np.any(rows == indices)  # no self loop
    assert np.array_equal(g.read_blob("degree"), np.bincount(indices, minlength=n))
    labels, split = g.read_blob("labels"), g.read_blob("split")
    assert labels.min() >= 0 and labels.max() < g.manifest.num_classes == 8
    frac = np.bincount(split, minlength=3) / n
    assert np.allclose(frac, [0.6, 0.2, 0.2], atol=0.03)
    order = g.read_blob("request_order")
    assert order.size == 10_000 and order.min() >= 0 and order.max() < n


def test_degree_statistics_follow_the_fitted_power_law(tmp_path):
    """Tolerances: mean exact; the largest in-degree within 10% of the fitted
    d_max (a binomial around it: sd sqrt(d_max) ~ 2%); the top 1% of vertices
    by expected degree receive their expected share of edges within 10%;
    in- and out-degrees are skewed (median below 0.8 x the mean, maximum
    over 50 x the median)."""
    store = _store(tmp_path)
    shape = plan_shape("stackoverflow", 0.01)
    synthesize(store, "stackoverflow", scale=0.01)
    g = open_graph(store, "stackoverflow-like")
    indeg = np.diff(g.read_blob("indptr"))
    outdeg = g.read_blob("degree").astype(np.int64)
    n, m = shape.num_nodes, shape.num_edges
    assert indeg.sum() == m and indeg.mean() == pytest.approx(
        LIKES["stackoverflow"].avg_degree, 1e-3
    )
    assert indeg.max() == pytest.approx(shape.max_degree, rel=0.10)
    w = np.sort(shape.expected_degrees())[::-1]
    top = n // 100
    expected_share = w[:top].sum() / m
    for deg in (indeg, outdeg):
        share = np.sort(deg)[::-1][:top].sum() / m
        assert share == pytest.approx(expected_share, rel=0.10)
        assert np.median(deg) < 0.8 * deg.mean() and deg.max() > 50 * np.median(deg)


def test_same_seed_same_graph_other_seed_other_graph(tmp_path):
    a, b, c = (f"file://{tmp_path / s}" for s in "abc")
    for store, seed in ((a, 7), (b, 7), (c, 8)):
        synthesize(store, "higgs-twitter", scale=0.005, seed=seed)
    blobs = [open_graph(s, "higgs-twitter-like").manifest.blobs for s in (a, b, c)]
    assert {k: v.sha256 for k, v in blobs[0].items()} == {k: v.sha256 for k, v in blobs[1].items()}
    for key in ("indices", "features", "labels", "request_order"):
        assert blobs[0][key].sha256 != blobs[2][key].sha256


def test_the_task_needs_the_graph(tmp_path):
    """A 1-layer GraphSAGE learns the planted classes far better than a linear
    model of the vertex's own features (the same training budget)."""
    torch = pytest.importorskip("torch")
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model, csr_edge_index

    store = _store(tmp_path)
    synthesize(store, "higgs-twitter", scale=0.004, seed=1)
    g = open_graph(store, "higgs-twitter-like")
    x = torch.from_numpy(np.array(g.read_blob("features")))
    y = torch.from_numpy(g.read_blob("labels").astype(np.int64))
    split = g.read_blob("split")
    train, test = (torch.from_numpy(np.flatnonzero(split == s)) for s in (0, 2))
    ei = csr_edge_index(g.read_blob("indptr"), g.read_blob("indices"))
    k = g.manifest.num_classes
    cfg = ModelConfig(arch="sage", in_dim=x.shape[1], hidden_dim=k, out_dim=k, num_layers=1)
    torch.manual_seed(0)
    models = {"gnn": build_model(cfg, seed=0), "linear": torch.nn.Linear(x.shape[1], k)}
    acc = {}
    for kind, model in models.items():
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(60):
            opt.zero_grad()
            out = model(x, ei) if kind == "gnn" else model(x)
            torch.nn.functional.cross_entropy(out[train], y[train]).backward()
            opt.step()
        with torch.no_grad():
            out = model(x, ei) if kind == "gnn" else model(x)
        acc[kind] = float((out[test].argmax(-1) == y[test]).float().mean())
    assert acc["gnn"] >= 0.6
    assert acc["gnn"] >= acc["linear"] + 0.25


def _synth_json(store: str, like: str, scale: float) -> dict:
    proc = _cli(
        "datasets", "synth", "--like", like, "--scale", str(scale), "--store", store, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_memory_does_not_grow_with_the_graph(tmp_path):
    """Peak RSS of the generating process (measured by itself, a subprocess per
    run) grows by under a quarter of what the graph grows: the graph streams
    through fixed-size blocks instead of being held."""
    small = _synth_json(f"file://{tmp_path / 's'}", "stackoverflow", 0.01)
    big = _synth_json(f"file://{tmp_path / 'b'}", "stackoverflow", 0.05)
    assert big["vertices"] == round(2_601_977 * 0.05) and big["feature_dim"] == 512
    grown_mib = (big["bytes"] - small["bytes"]) / 2**20
    assert grown_mib > 200
    assert big["peak_rss_mib"] - small["peak_rss_mib"] < 0.25 * grown_mib


def test_interrupted_run_leaves_the_old_graph_and_nothing_else(tmp_path):
    store = _store(tmp_path)
    root = tmp_path / "store"
    old = write_graph(
        store,
        "g",
        indptr=np.array([0, 1, 2]),
        indices=np.array([1, 0]),
        features=np.ones((2, 4), np.float32),
        symmetrized=False,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnn_faas", "datasets", "synth", "--like", "stackoverflow"]
        + ["--scale", "0.3", "--name", "g", "--store", store],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # wait (polling) until it has started writing edges into its staging area
        deadline = time.monotonic() + 120
        while proc.poll() is None and not list(root.glob(".tmp-stage-*/indices.bin")):
            assert time.monotonic() < deadline, "the generator never started writing"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0  # it was interrupted, not finished
    assert sorted(p.name for p in root.iterdir()) == ["g"]  # no staging left
    assert list_graphs(store) == ["g"]
    g = open_graph(store, "g", verify="full")
    assert g.manifest == old


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(InvalidRequest, match="scale"):
        plan_shape("reddit", 0.0)
    with pytest.raises(InvalidRequest, match="too few"):
        plan_shape("reddit", 0.0005)
    proc = _cli("datasets", "synth", "--like", "citeseer", "--store", _store(tmp_path))
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = _cli(
        "datasets", "synth", "--like", "reddit", "--scale", "2", "--store", _store(tmp_path)
    )
    assert proc.returncode != 0 and "--scale" in proc.stderr and "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "store" / "reddit-like")

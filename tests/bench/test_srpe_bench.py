"""``gnn-faas bench srpe`` on Cora (OMEGA's protocol, small)."""

from __future__ import annotations

import json

import pytest

from gnn_faas.cli import main


def test_srpe_bench_on_cora(tmp_path, capsys):
    argv = ["bench", "srpe", "--graph", "cora", "--store", f"file://{tmp_path}", "--queries", "30",
            "--budgets", "0,1", "--policies", "query_edge_ratio,random", "--epochs", "30",
            "--repeat", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    # a GCN's recomputed candidates come from their stored states (exact, asserted below)
    assert r["recompute"] == "state"
    assert r["queries"] == 30 and r["accuracy_kind"] == "labels"
    assert 0 <= r["exact"]["accuracy"] <= 1 and r["exact"]["p50_ms"] > 0
    # the breakdown: building the graph is part of each serving; every serving reads the store
    assert 0 < r["exact"]["graph_p50_ms"] <= r["exact"]["p50_ms"]
    assert r["exact"]["reads_mean"] >= 3  # >= 1 hop of indptr + indices, then the features
    for policy in ("query_edge_ratio", "random"):
        full = r["policies"][policy]["1"]
        # budget 1 recomputes every candidate: the answers are exact serving's
        assert full["agreement_with_exact"] == 1.0
        assert full["accuracy"] == r["exact"]["accuracy"] and full["rel_error_mean"] < 1e-4
        none = r["policies"][policy]["0"]
        assert none["recomputed_mean"] == 0 and none["rows_mean"] <= full["rows_mean"]
        assert none["rel_error_mean"] > full["rel_error_mean"]  # stale neighbours cost accuracy
        assert none["rows_p50"] <= full["rows_p50"] == r["exact"]["rows_p50"]
        assert 0 < none["graph_p50_ms"] <= none["p50_ms"] and none["reads_mean"] >= 3
        # every candidate recomputed, from one state row each: fewer bytes than exact serving
        assert full["bytes_p50"] < r["exact"]["bytes_p50"]
    assert main(argv + ["--recompute", "full"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["recompute"] == "full"
    for policy in ("query_edge_ratio", "random"):
        assert whole["policies"][policy]["1"]["agreement_with_exact"] == 1.0
        state, full = r["policies"][policy]["1"], whole["policies"][policy]["1"]
        assert state["bytes_p50"] < full["bytes_p50"]
    assert main(["bench", "srpe", "--graph", "cora", "--budgets", "2"]) == 2


def test_srpe_bench_on_a_synthetic_graph(tmp_path, capsys):
    """Any labelled graph: the model is trained on the stored split's train part,
    queries come from its test part; rows and bytes are reported per setting."""
    from gnn_faas.storage.synth import synthesize

    store = f"file://{tmp_path}"
    synthesize(store, "higgs-twitter", scale=0.004, seed=2)
    argv = ["bench", "srpe", "--graph", "higgs-twitter-like", "--store", store, "--queries",
            "12", "--budgets", "0,1", "--policies", "query_edge_ratio", "--epochs", "10",
            "--hidden", "16", "--repeat", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["graph"] == "higgs-twitter-like" and r["accuracy_kind"] == "labels"
    assert r["queries"] == 12 and r["train_seconds"] > 0
    exact, row = r["exact"], r["policies"]["query_edge_ratio"]
    assert row["1"]["agreement_with_exact"] == 1.0
    assert row["1"]["rows_p50"] == exact["rows_p50"] > row["0"]["rows_p50"] >= 1
    # stale embeddings of the 1-hop neighbours instead of the 2-hop features
    assert 0 < row["0"]["bytes_p50"] < exact["bytes_p50"]
    assert main(["bench", "srpe", "--graph", "no-such-graph", "--store", store]) != 0


@pytest.mark.slow
def test_srpe_bench_live_on_cora(tmp_path, capsys):
    """``--live``: the held-out requests served over HTTP by a gnn-faas up stack,
    exact and each budget from stored states and from neighbourhoods."""
    argv = ["bench", "srpe", "--graph", "cora", "--store", f"file://{tmp_path}", "--queries", "5",
            "--budgets", "0.25,1", "--policies", "query_edge_ratio", "--epochs", "5",
            "--repeat", "1", "--live", "--memory-mb", "256", "--compute-mb", "512", "--json"]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["live"] and r["queries"] == 5 and r["exact"]["p50_ms"] > 0
    assert r["exact"]["state_rows_p50"] == 0 and r["exact"]["memory_rows_p50"] > 0
    for budget in ("0.25", "1"):
        cell = r["policies"]["query_edge_ratio"][budget]
        state, nbhd = cell["state"], cell["neighbourhood"]
        assert state["recompute_from"] == ["state"] and nbhd["recompute_from"] == ["neighbourhood"]
        assert state["recomputed_mean"] == nbhd["recomputed_mean"] > 0
        # the same aggregates two ways; the state way reads state rows, not neighbourhoods
        assert state["rel_error_vs_neighbourhood"] < 1e-4
        assert state["state_rows_p50"] > 0 == nbhd["state_rows_p50"]
        assert state["memory_rows_p50"] <= nbhd["memory_rows_p50"]
        assert state["gateway_bytes_p50"] < nbhd["gateway_bytes_p50"]
    full = r["policies"]["query_edge_ratio"]["1"]
    assert (
        full["state"]["agreement_with_exact"]
        == full["neighbourhood"]["agreement_with_exact"]
        == 1.0
    )
    assert full["state"]["rel_error_mean"] < 1e-4

"""``gnn-faas bench cache`` on Bitcoin OTC's real request order."""

from __future__ import annotations

import json

import pytest

from gnn_faas.cli import main
from gnn_faas.storage.datasets import ensure_dataset


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = f"file://{tmp_path_factory.mktemp('store')}"
    ensure_dataset(uri, "bitcoin-otc")
    return uri


def bench(store, capsys, *extra) -> dict:
    argv = ["bench", "cache", "--store", store, "--graph", "bitcoin-otc", "--json", *extra]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_adaptive_beats_static_top_degree_on_the_real_order(store, capsys):
    r = bench(store, capsys, "--order", "time", "--cache-fraction", "0.1", "--requests", "300")
    g = ensure_dataset(store, "bitcoin-otc")
    assert r["requests"] == 300 and r["cache_rows"] == int(0.1 * g.num_nodes)
    assert r["hops"] == 2 and r["fanouts"] == [10, 5]
    # no cache can hit a row's first lookup
    assert 0 <= r["adaptive_hit_rate"] <= 1 - r["unique_rows"] / r["lookups"]
    assert 0 <= r["static_hit_rate"] <= 1
    assert r["adaptive_hit_rate"] >= r["static_hit_rate"] + 0.10
    assert r["admissions"] - r["evictions"] <= r["cache_rows"]
    assert r["evictions"] > 0  # 852 distinct rows do not fit in 588
    assert 0 < r["peak_memory_bytes"] <= r["cache_rows"] * 4 * g.manifest.feature_dim
    assert r["seconds"] > 0


def test_options_and_errors(store, capsys):
    full = bench(store, capsys, "--requests", "20", "--fanout", "full", "--features", "skip",
                 "--order", "random", "--batch", "2")  # fmt: skip
    assert full["fanouts"] is None and full["order"] == "random" and full["batch"] == 2
    assert full["lookups"] >= 40
    argv = ["bench", "cache", "--store", store, "--graph", "bitcoin-otc", "--fanout", "3"]
    assert main(argv) == 2  # one fanout for two hops: a one-line error
    assert "one value per hop" in capsys.readouterr().err
    assert main([*argv[:-2], "--cache-fraction", "0"]) == 2


def test_priors_side_by_side(store, capsys):
    r = bench(store, capsys, "--requests", "200", "--prior", "degree,fap", "--fap-refresh", "50",
              "--warm", "--features", "skip")  # fmt: skip
    assert set(r["hit_rates"]) == {"degree", "fap"}
    assert r["skipped_requests"] > 0 and r["requests"] == 200  # FAP never sees the replay
    for h in r["hit_rates"].values():
        assert 0 <= h["static_hit_rate"] <= 1 and 0 <= h["adaptive_hit_rate"] <= 1
        assert h["warmed_rows"] == r["cache_rows"]
    assert r["adaptive_hit_rate"] == r["hit_rates"]["degree"]["adaptive_hit_rate"]
    assert main(["bench", "cache", "--store", store, "--graph", "bitcoin-otc", "--prior", "x"]) == 2

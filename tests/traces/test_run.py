"""``gnn-faas simulate`` end to end on a short window: the JSON benchmark's
keys, the run directory (CSV, JSON, non-empty PNG plots), the study tables."""

from __future__ import annotations

import csv
import json

import pytest

from gnn_faas.cli import main
from gnn_faas.traces.study import study_tables


def test_simulate_json_and_run_directory(tmp_path, bitcoin_store, capsys):
    out = tmp_path / "run"
    rc = main(["simulate", "azure2019", "--minutes", "1", "--start-minute", "60",
               "--store", bitcoin_store, "--policies", "all", "--json", "--out", str(out)])  # fmt: skip
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    assert {"wall_s", "requests", "policies"} <= set(result)
    assert set(result["policies"]) == {
        "gnn_faas", "faas_gnn", "request_centric", "dgl_serverless", "serverful"
    }  # fmt: skip
    for name, p in result["policies"].items():
        for key in ("p50_ms", "p99_ms", "slo_violations", "gb_s", "vcpu_s", "cold_starts"):
            assert key in p, (name, key)
        assert p["dollars"] and all(v > 0 for v in p["dollars"].values())
        assert p["requests"] == result["requests"] > 1000
        # storage requests beside compute: GETs priced at S3's $0.0004 per 1,000
        st = p["storage"]
        assert st["gets"] > 0
        assert st["dollars"]["s3_standard"] == pytest.approx(st["gets"] * 0.0004 / 1000)
    pol = result["policies"]
    model = result["storage_model"]
    assert model["scheme"] == "s3" and model["per_fetch"] + model["per_row"] > 0
    # shared buffers fetch once for many requests; downloads happen per start only
    assert pol["gnn_faas"]["storage"]["gets"] < pol["faas_gnn"]["storage"]["gets"]
    assert pol["dgl_serverless"]["storage"]["gets"] == (
        pol["dgl_serverless"]["cold_starts"] * model["full_download"]
    )
    for png in ("latency_cdf.png", "rate_instances.png", "memory.png", "cost.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with open(out / "timeline_gnn_faas.csv") as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["arrivals"]) for r in rows) == result["requests"]
    assert sum(float(r["allocated_gb"]) for r in rows) == pytest.approx(
        result["policies"]["gnn_faas"]["gb_s"], rel=1e-4
    )
    assert json.loads((out / "summary.json").read_text())["requests"] == result["requests"]
    tables = study_tables(result)
    assert "−48.6%" in tables and "| serverful |" in tables


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "twitter", "--policies", "nope"], "unknown policy"),
        (["simulate", "azure2019", "--minutes", "0"], "--minutes"),
        (["simulate", "azure2021", "--trace-file", "/nonexistent.csv"], "not found"),
        (["simulate", "calibrate"], "--out"),
        (["simulate", "calibrate-graph"], "--out"),
        (["simulate", "azure2019", "--warmup", "-1"], "--warmup"),
        (["simulate", "twitter", "--day", "--warmup", "10"], "--warmup"),
    ],
)
def test_simulate_bad_input(argv, message, capsys, bitcoin_store):
    assert main([*argv, "--store", bitcoin_store]) == 2
    assert message in capsys.readouterr().err


def test_simulate_with_a_warm_up_measures_the_same_window(bitcoin_store, capsys):
    """``--warmup 30`` simulates the 30 s before the window too, and reports
    the window: the same requests as without it, with the instances the
    warm-up launched already there (no more cold starts, never fewer GB-s)."""
    base = ["simulate", "azure2019", "--minutes", "1", "--start-minute", "60", "--store",
            bitcoin_store, "--policies", "gnn_faas,request_centric", "--json"]  # fmt: skip
    assert main(base) == 0
    cold = json.loads(capsys.readouterr().out)
    assert main([*base, "--warmup", "30"]) == 0
    warm = json.loads(capsys.readouterr().out)
    assert warm["requests"] == cold["requests"] and warm["warmup_s"] == 30.0
    assert warm["duration_s"] == cold["duration_s"] == 60.0
    for name in ("gnn_faas", "request_centric"):
        c, w = cold["policies"][name], warm["policies"][name]
        assert w["requests"] == c["requests"]
        assert w["cold_starts"] <= c["cold_starts"]


def test_policy_table_shows_storage_beside_compute(bitcoin_store, capsys):
    argv = ["simulate", "azure2019", "--minutes", "1", "--start-minute", "60", "--store",
            bitcoin_store, "--policies", "gnn_faas,dgl_serverless"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| storage GETs / req | storage $ / M req |" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert "s3_standard" in rows["gnn_faas"] and "elasticache_redis" in rows["gnn_faas"]


def test_simulate_with_sampled_fanouts(tmp_path, bitcoin_store, capsys):
    """``--fanouts`` (or a calibration measured with them) builds the requests'
    k-hop sets with the fetcher's sample: at most ``1 + f1 + f1·f2`` rows a
    request, fewer than full neighbourhoods; the study tables say which."""
    from gnn_faas.traces.calibration import Calibration

    base = ["simulate", "azure2019", "--minutes", "1", "--start-minute", "60", "--store",
            bitcoin_store, "--policies", "all", "--json"]  # fmt: skip
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*base, "--fanouts", "3,2"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    assert full["fanouts"] is None and sampled["fanouts"] == [3, 2]
    assert sampled["rows_per_request_mean"] <= 1 + 3 + 6
    assert sampled["rows_per_request_mean"] < full["rows_per_request_mean"]
    assert sampled["storage_model"]["rows_per_request"] <= 1 + 3 + 6
    assert "sampled fanouts 3,2" in study_tables(sampled)
    for p in sampled["policies"].values():  # dropped requests count at the timeout in *_all
        assert p["mean_ms_all"] >= p["mean_ms"] - 1e-9
        if p["dropped"] == 0:
            assert p["mean_ms_all"] == pytest.approx(p["mean_ms"])
            assert p["p99_ms_all"] == pytest.approx(p["p99_ms"])
        else:
            assert p["mean_ms_all"] > p["mean_ms"]
    assert "full neighbourhoods" in study_tables(full)
    # a calibration measured with fanouts is simulated with them by default
    cal = Calibration.from_dict({**Calibration.bundled("bitcoin-otc").to_dict(), "fanouts": [3, 2]})
    cal.save(tmp_path / "cal.json")
    assert main([*base, "--calibration", str(tmp_path / "cal.json")]) == 0
    assert json.loads(capsys.readouterr().out)["fanouts"] == [3, 2]
    assert main([*base, "--fanouts", "3"]) == 2
    assert "one fanout per hop" in capsys.readouterr().err


def test_the_request_timeout_is_the_studys_stated_assumption(tmp_path, bitcoin_store, capsys):
    """A DGL-serverless cold start longer than the request timeout drops the
    requests that wait for it (counted at the timeout in ``*_all``); under a
    timeout beyond the cold start the same requests complete, each with its
    whole wait, and the study states the timeout it assumed."""
    from gnn_faas.traces.calibration import Calibration

    cal = Calibration.from_dict(
        {**Calibration.bundled("bitcoin-otc").to_dict(), "full_fetch_s": 40.0}
    )
    cal.save(tmp_path / "cal.json")
    base = ["simulate", "azure2019", "--minutes", "1", "--start-minute", "60", "--store",
            bitcoin_store, "--policies", "all", "--json",
            "--calibration", str(tmp_path / "cal.json")]  # fmt: skip
    assert main(base) == 0
    short = json.loads(capsys.readouterr().out)
    assert main([*base, "--request-timeout", "300"]) == 0
    long = json.loads(capsys.readouterr().out)
    assert (short["timeout_s"], long["timeout_s"]) == (30.0, 300.0)
    s, g = short["policies"]["dgl_serverless"], long["policies"]["dgl_serverless"]
    assert s["dropped"] > 0 and g["dropped"] == 0  # every wait ends within 300 s
    assert s["completed"] + s["dropped"] == g["completed"] == g["requests"]
    # completed-only figures flatter the short timeout: it keeps the warm requests only
    assert s["mean_ms"] < g["mean_ms"] and s["p99_ms"] < g["p99_ms"]
    assert g["p99_ms"] > 40_000  # a cold-started request waits the 40 s download
    # at the short timeout every request counts: the dropped ones at 30 s, a lower bound
    assert s["mean_ms_all"] <= g["mean_ms_all"]
    assert g["mean_ms_all"] == pytest.approx(g["mean_ms"])
    assert "timeout: 300 s, `--request-timeout`" in study_tables(long)
    assert main([*base, "--request-timeout", "0"]) == 2
    assert "--request-timeout must be positive" in capsys.readouterr().err

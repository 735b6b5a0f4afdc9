"""The open-loop sender classifies answers (ok / shed / error) and measures them;
the soak's RSS trend is a least-squares slope and a relative change."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from gnn_faas.bench.open_loop import poisson_arrivals, run_open_loop
from gnn_faas.bench.soak import rss_trend


@pytest.fixture
def server():
    app = Flask("fake-gateway")

    @app.post("/v2/models/m/infer")
    def infer():
        target = request.get_json()["inputs"][0]["data"][0]
        if target % 3 == 1:
            resp = jsonify({"error": "overloaded"})
            resp.status_code, resp.headers["Retry-After"] = 503, "1"
            return resp
        if target % 3 == 2:
            return jsonify({"error": "bad"}), 400
        return jsonify({"outputs": []})

    srv = make_server("127.0.0.1", 0, app, threaded=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_answers_are_classified_and_counted(server):
    due = np.linspace(0, 0.3, 30)
    result = run_open_loop(server, "m", due, np.arange(30))
    s = result.summary(slo_s=10.0)
    assert (s["requests"], s["ok"], s["shed"], s["errors"]) == (30, 10, 10, 10)
    assert s["shed_with_retry_after"] == 10 and s["slo_violations"] == 0
    assert s["error_examples"] and s["error_examples"][0].startswith("400")
    assert 0 < s["p50_ms"] <= s["p99_ms"] < 10_000
    assert result.summary(slo_s=0.0)["slo_violations"] == 10  # every ok answer is late


def test_unreachable_gateway_is_an_error_not_a_hang():
    result = run_open_loop("http://127.0.0.1:9", "m", np.zeros(2), np.arange(2), timeout_s=2)
    assert result.summary(1.0)["errors"] == 2


def test_poisson_arrivals_have_the_rate():
    t = poisson_arrivals(200.0, 50.0, seed=1)
    assert np.all(np.diff(t) >= 0) and t.max() < 50.0
    assert t.size == pytest.approx(10_000, rel=0.05)


@pytest.mark.parametrize("slope", [0.0, 0.5, -1.0])
def test_rss_trend(slope):
    t = np.linspace(2, 20, 109)
    mib = 80 + slope * t + 0.01 * np.sin(t)
    tr = rss_trend(t, mib)
    assert tr["slope_mib_per_min"] == pytest.approx(slope, abs=0.01)
    want = slope * (t[-10:].mean() - t[:10].mean()) / (80 + slope * t[:10].mean())
    assert tr["relative_change"] == pytest.approx(want, abs=0.002)

"""``gnn-faas replay --updates``: graph updates sent beside the request trace.

Against a small local server, the sender posts every batch once, at or after
its due time, with the bearer token, one at a time, and records each ack's
latency, status and version (a refused batch is an error, not an ack).
Against ``gnn-faas up`` (a write token in its ``graphs`` section), a short
Twitter window replayed with the Bitcoin OTC edges after the cut-off: every
batch acknowledged, the served graph's version advanced by one per batch,
every request answered; a wrong token changes nothing.
"""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import redirect_stdout

import numpy as np
import pytest
import requests

from gnn_faas.cli import main
from gnn_faas.traces.replay import UpdateSender
from tests.servers import QuietHandler, http_server

TOKEN = "replay-secret"


class _Graphs(QuietHandler):
    lock = threading.Lock()
    got: list = []
    active = peak = 0

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.active += 1
            cls.peak = max(cls.peak, cls.active)
        time.sleep(0.02)
        ok = self.headers.get("Authorization") == f"Bearer {TOKEN}" and self.path.endswith(
            "/v2/graphs/g/updates"
        )
        with cls.lock:
            cls.active -= 1
            if ok:
                cls.got.append((time.monotonic(), body["add_edges"]))
            version = len(cls.got)
        data = json.dumps({"version": version} if ok else {"error": "no"}).encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _batches(n: int, gap: float) -> list:
    return [(k * gap, np.asarray([[k, k + 1], [k + 2, k]], np.int64)) for k in range(n)]


def test_the_sender_posts_each_batch_at_its_time_with_the_token():
    _Graphs.got, _Graphs.peak = [], 0
    with http_server(_Graphs) as url:
        sender = UpdateSender(url, "g", _batches(8, 0.05), TOKEN)
        with sender:
            pass
        s = sender.summary()
    assert [edges for _, edges in _Graphs.got] == [b.tolist() for _, b in _batches(8, 0.05)]
    assert _Graphs.peak == 1  # one writer: a batch at a time
    assert s["batches"] == s["sent"] == s["acked"] == 8 and s["errors"] == 0
    assert s["edges_acked"] == 16 and (s["first_version"], s["last_version"]) == (1, 8)
    assert np.all(sender.send >= sender.due - 1e-3)  # never early
    assert s["ack_p50_ms"] >= 20.0 and np.all(sender.latency >= 0.02)


def test_a_refused_batch_is_an_error_not_an_ack():
    _Graphs.got = []
    with http_server(_Graphs) as url:
        sender = UpdateSender(url, "g", _batches(3, 0.01), "wrong")
        with sender:
            pass
    s = sender.summary()
    assert s["acked"] == 0 and s["errors"] == 3 and s["ack_p50_ms"] is None
    assert "403" in s["error_examples"][0] and _Graphs.got == []


def test_updates_need_a_token(capsys, monkeypatch):
    monkeypatch.delenv("GNN_FAAS_WRITE_TOKEN", raising=False)
    code = main(["replay", "twitter", "--url", "http://127.0.0.1:9", "--updates",
                 "bitcoin-otc-time", "--minutes", "0.1"])  # fmt: skip
    assert code != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--token or GNN_FAAS_WRITE_TOKEN" in err


@pytest.mark.slow
def test_a_live_replay_with_updates_advances_the_served_graph(bitcoin_store, tmp_path):
    from gnn_faas.bench.instance_start import default_model
    from gnn_faas.stack import Stack

    ckpt = default_model(str(tmp_path / "model"), bitcoin_store, "bitcoin-otc")
    config = {
        "store": bitcoin_store,
        "gateway": {"admission": False},
        "graphs": {"write_token": TOKEN, "freshness_s": 0, "compact_share": 0},
        "platform": {"memory_function_mb": 256, "compute_function_mb": 512,
                     "max_memory_instances": 1, "max_compute_instances": 1},
        "models": [{"name": "bitcoin-otc", "graph": "bitcoin-otc", "dataset": "bitcoin-otc",
                    "checkpoint": ckpt}],
    }  # fmt: skip
    argv = ["replay", "twitter", "--model", "bitcoin-otc", "--store", bitcoin_store,
            "--minutes", "0.1", "--start-minute", "450", "--updates", "bitcoin-otc-time",
            "--update-rate", "400", "--update-batch", "200", "--json", "--no-progress"]  # fmt: skip
    with Stack(config, ready_timeout_s=180) as stack:
        before = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()
        out = io.StringIO()
        with redirect_stdout(out):
            assert main([*argv, "--url", stack.url, "--token", TOKEN]) == 0
        summary = json.loads(out.getvalue())
        after = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()
        out = io.StringIO()
        with redirect_stdout(out):
            assert main([*argv, "--url", stack.url, "--token", "not-it"]) == 0
        refused = json.loads(out.getvalue())["updates"]
        unchanged = requests.get(f"{stack.url}/v2/graphs/bitcoin-otc", timeout=10).json()
    u = summary["updates"]
    # 400 edges/s over 6 s in batches of 200: about a dozen batches, all acknowledged
    assert u["stream"] == "bitcoin-otc-time" and u["batch"] == 200
    assert u["batches"] >= 5 and u["acked"] == u["sent"] == u["batches"] and u["errors"] == 0
    assert u["edges_acked"] == 200 * u["batches"]
    assert u["last_version"] - u["first_version"] == u["batches"] - 1
    assert after["version"] == before["version"] + u["batches"] == u["last_version"]
    assert u["ack_p99_ms"] > 0
    assert summary["ok"] == summary["requests"] > 0  # every request answered beside them
    assert refused["acked"] == 0 and refused["errors"] == refused["batches"]
    assert unchanged["version"] == after["version"]

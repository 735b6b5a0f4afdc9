"""Open-loop replay against a small local HTTP server: every request is sent
once, at (or after) its arrival time, never more than ``max_senders`` in
flight; statuses and the gateway's parameters are recorded per request; an
unreachable gateway is a clear CLI error."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.traces.replay import replay
from tests.servers import QuietHandler, http_server


class _Handler(QuietHandler):
    lock = threading.Lock()
    active = 0
    peak = 0
    seen: list[int] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        target = body["inputs"][0]["data"][0]
        cls = type(self)
        with cls.lock:
            cls.active += 1
            cls.peak = max(cls.peak, cls.active)
            cls.seen.append(target)
        time.sleep(0.05)
        with cls.lock:
            cls.active -= 1
        status = 400 if target == 13 else 200
        out = {"parameters": {"buffer_wait_ms": 7.0, "sharing_degree": 0.5, "execution": "e"}}
        data = json.dumps(out if status == 200 else {"error": "bad"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    with http_server(_Handler) as url:
        yield url


def test_open_loop_bounded_and_recorded(server):
    _Handler.seen, _Handler.peak = [], 0
    arrivals = np.linspace(0, 0.2, 40)  # 40 requests in 0.2 s, each served in 50 ms
    targets = np.arange(40)
    r = replay(server, "m", arrivals, targets, max_senders=4)
    assert sorted(_Handler.seen) == list(range(40))
    assert _Handler.peak <= 4
    assert r.sent == 40 and r.ok == 39 and r.errors == 1
    assert r.status[13] == 400 and (r.status == 200).sum() == 39
    assert np.all(r.send >= arrivals - 1e-3)  # never early
    assert np.all(r.latency >= 0.045)
    np.testing.assert_allclose(r.buffer_wait[r.status == 200], 0.007)
    assert r.sharing[0] == 0.5 and r.execution[0] == "e"
    # four senders at 50 ms each cannot keep up with 200 requests/s: sends lag
    assert np.nanmax(r.send - arrivals) > 0.2
    # after a warm-up of 0.1 s: the later requests, times from its end
    w = r.after(0.1)
    m = arrivals >= 0.1
    assert w.sent == m.sum() and w.ok + w.errors == w.sent
    assert w.errors == int((r.status[m] != 200).sum())
    np.testing.assert_allclose(w.arrival, arrivals[m] - 0.1)
    np.testing.assert_allclose(w.send, r.send[m] - 0.1)
    np.testing.assert_allclose(w.latency, r.latency[m])
    assert w.execution == [e for e, k in zip(r.execution, m, strict=True) if k]
    assert w.start_monotonic == pytest.approx(r.start_monotonic + 0.1)


def test_replay_cli_unreachable_gateway(capsys):
    assert main(["replay", "azure2019", "--url", "http://127.0.0.1:9", "--minutes", "1"]) == 2
    assert "cannot reach the gateway" in capsys.readouterr().err


def test_live_dollars_bill_each_function_its_stage():
    """Per execution, the memory function is billed ``aggregate_ms`` and the compute
    function ``update_ms``; without them, both the execution's seconds."""
    from gnn_faas.traces.cost import load_prices
    from gnn_faas.traces.live import live_dollars
    from gnn_faas.traces.replay import ReplayResult

    def result(aggregate, update):
        return ReplayResult(
            arrival=np.zeros(3), send=np.zeros(3), latency=np.array([0.5, 0.5, 0.9]),
            status=np.array([200, 200, 200]), buffer_wait=np.array([0.1, 0.1, 0.1]),
            sharing=np.zeros(3), execution=["a", "a", "b"],
            aggregate=np.asarray(aggregate, float), update=np.asarray(update, float),
        )  # fmt: skip

    status = {"instances": [{"spec": {"kind": "memory", "memory_mb": 1024, "vcpus": 1.0}},
                            {"spec": {"kind": "compute", "memory_mb": 2048, "vcpus": 1.0}}]}  # fmt: skip
    prices = load_prices()
    staged = live_dollars(result([0.3, 0.3, 0.6], [0.1, 0.1, 0.2]), status, prices, 3)
    whole = live_dollars(result([np.nan] * 3, [np.nan] * 3), status, prices, 3)
    gb_s = lambda m, c: 1.0 * m + 2.0 * c  # noqa: E731 - GB-s of the two executions
    rate = prices["lambda_x86"].gb_s  # two requests' worth of per-request fees cancel out
    assert staged["lambda_x86"] - whole["lambda_x86"] == pytest.approx(
        rate * (gb_s(0.9, 0.3) - gb_s(0.4 + 0.8, 0.4 + 0.8)), rel=1e-6
    )
    assert live_dollars(result([0.3] * 3, [0.1] * 3), {"instances": []}, prices, 3) == {}


def test_fit_warmup_needs_predict_and_a_warmup(capsys):
    argv = ["replay", "azure2019", "--url", "http://127.0.0.1:9", "--fit-warmup"]
    assert main(argv) == 2
    assert "--fit-warmup needs --predict and a --warmup" in capsys.readouterr().err
    assert main([*argv, "--predict"]) == 2
    assert "--fit-warmup needs" in capsys.readouterr().err


def test_status_sampler_skips_error_answers():
    """A ``/v1/status`` that answers an error is no sample (its body lists no
    instances: read as a sample, it would show the pool empty)."""
    from gnn_faas.traces.replay import StatusSampler

    class Status(QuietHandler):
        calls = 0

        def do_GET(self):  # noqa: N802 - http.server's name
            type(self).calls += 1
            ok = type(self).calls % 2 == 1
            inst = {"state": "ready", "spec": {"name": "f", "memory_mb": 512}}
            data = json.dumps({"instances": [inst]} if ok else {"error": "internal"}).encode()
            self.send_response(200 if ok else 500)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    with http_server(Status) as url, StatusSampler(url, time.monotonic(), 0.01) as s:
        deadline = time.monotonic() + 30  # poll until three error answers were seen
        while s.failed < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert s.failed >= 3 and len(s.samples) >= 3
    assert all(x["allocated_gb"] == 0.5 and x["instances"] == {"f": 1} for x in s.samples)


def test_last_answer_ends_with_the_latest_answer_not_the_latest_send():
    from gnn_faas.traces.replay import ReplayResult

    result = ReplayResult(
        send=np.array([0.0, 1.0, 2.0]),
        latency=np.array([3.5, 0.1, np.nan]),  # the last send never answered
    )
    assert result.last_answer_s == pytest.approx(3.5)
    assert ReplayResult().last_answer_s == 0.0

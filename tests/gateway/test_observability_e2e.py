"""What an operator sees of a real stack (``gnn-faas up``: gunicorn gateway,
memory and compute function processes) after one inference:

- every series each query of the shipped Grafana dashboard names is in the
  ``/metrics`` of the gateway or of a function (so no panel is empty for want
  of a series), and the metering counters are in base units;
- every log line of every process is one JSON object, and the client's W3C
  ``traceparent`` trace id is the ``request_id`` of the gateway's, the memory
  function's and the compute function's lines for that request.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from gnn_faas.client import vertex_request
from gnn_faas.request_id import parse_traceparent
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from tests.charts.dashboard import expressions, load, metric_names, sample_names
from tests.pyg_reference import GCN, checkpoint_with_reference

pytestmark = pytest.mark.slow
MODEL = "btc"
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE}-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("observability")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    checkpoint_with_reference(graph, root / "ckpt", seed=7, **GCN)
    config = {
        "store": store,
        "platform": {
            "memory_function_mb": 256,
            "compute_function_mb": 512,
            "max_memory_instances": 1,
            "max_compute_instances": 1,
        },
        "models": [
            {
                "name": MODEL,
                "graph": "bitcoin-otc",
                "dataset": "bitcoin-otc",
                "checkpoint": str(root / "ckpt"),
            }
        ],
    }
    tmp = root / "tmp"  # the local platform's instance logs go under $TMPDIR
    tmp.mkdir()
    with Stack(config, ready_timeout_s=120, log_level="info", env={"TMPDIR": str(tmp)}) as stack:
        resp = requests.post(
            f"{stack.url}/v2/models/{MODEL}/infer",
            json=vertex_request([1, 2, 3]),
            headers={"traceparent": TRACEPARENT},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        yield stack, resp, tmp


def scrape(url: str) -> str:
    resp = requests.get(f"{url}/metrics", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return resp.text


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of the samples of ``name``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, value = line.rsplit(" ", 1)
            out[key[len(name) :]] = float(value)
    return out


def test_every_dashboard_query_names_series_the_stack_serves(served):
    stack, _, _ = served
    status = stack.status()
    urls = {i["spec"]["kind"]: i["url"] for i in status["instances"]}
    assert set(urls) == {"memory", "compute"}
    texts = {"gateway": scrape(stack.url), **{k: scrape(u) for k, u in urls.items()}}
    served_names = set().union(*(sample_names(t) for t in texts.values()))
    missing = {
        where: sorted(metric_names(expr) - served_names)
        for where, expr in expressions(load())
        if metric_names(expr) - served_names
    }
    assert missing == {}
    # each process has its own process collector and HTTP counters
    for role, text in texts.items():
        assert samples(text, "process_resident_memory_bytes"), role
        assert samples(text, "gnn_faas_http_requests_total")[""] >= 1, role
    # the request was counted; the old metering gauges are gone
    gw = texts["gateway"]
    assert samples(gw, "gnn_faas_requests_total") == {
        f'{{kind="vertex",model="{MODEL}",status="ok"}}': 1.0
    }
    assert "gnn_faas_allocated_gb_s" not in gw and "gnn_faas_cold_starts" not in gw.replace(
        "gnn_faas_function_cold_starts", ""
    )
    assert samples(gw, "gnn_faas_requests_shed_total") == {f'{{model="{MODEL}"}}': 0.0}
    # the cache and storage reads of the memory function that served it
    mem = texts["memory"]
    lookups = samples(mem, "gnn_faas_cache_lookups_total")['{graph="bitcoin-otc"}']
    hits = samples(mem, "gnn_faas_cache_hits_total")['{graph="bitcoin-otc"}']
    misses = samples(mem, "gnn_faas_cache_misses_total")['{graph="bitcoin-otc"}']
    assert lookups > 0 and hits + misses == lookups
    file_reads = '{backend="file",graph="bitcoin-otc"}'
    # the memory function's rows come from the store; the gateway's k-hop step reads its
    # resident structure (read once at start), so no request made it read the store
    assert samples(mem, "gnn_faas_storage_read_bytes_total")[file_reads] > 0
    assert samples(gw, "gnn_faas_storage_read_bytes_total")[file_reads] == 0
    resident = samples(gw, "gnn_faas_structure_bytes")['{graph="bitcoin-otc",how="resident"}']
    assert resident > 0
    assert samples(mem, "gnn_faas_storage_requests_total")[file_reads] >= 1
    calls = samples(texts["compute"], "gnn_faas_function_calls_total")
    assert calls['{endpoint="post",role="compute"}'] >= 1


def test_metering_counters_are_in_byte_seconds(served):
    stack, _, _ = served
    before = stack.status()["metering"]["by_function"][f"{MODEL}-memory"]
    counter = samples(scrape(stack.url), "gnn_faas_function_allocated_memory_byte_seconds_total")
    after = stack.status()["metering"]["by_function"][f"{MODEL}-memory"]
    value = counter[f'{{function="{MODEL}-memory"}}']
    # 256 MiB alive for some seconds: GiB-s x 2^30, read between two status calls
    assert before["allocated_gb_s"] * 2**30 <= value <= after["allocated_gb_s"] * 2**30
    assert value > 0


def json_lines(path: Path) -> list[dict]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert lines, path
    out = []
    for line in lines:
        obj = json.loads(line)  # raises on any non-JSON line
        assert isinstance(obj, dict) and {"ts", "level", "logger", "msg"} <= set(obj), line
        out.append(obj)
    return out


def wait_for(path_glob, tmp: Path, pred, timeout: float = 20.0) -> list[dict]:
    """The JSON lines of the one log file matching ``path_glob`` once one of
    them satisfies ``pred`` (a process writes its access line after answering)."""
    deadline = time.monotonic() + timeout
    while True:
        (path,) = [p for p in tmp.glob(path_glob)]
        lines = json_lines(path)
        if any(pred(x) for x in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_every_process_logs_json_lines_carrying_the_request_id(served):
    stack, resp, tmp = served
    answer = parse_traceparent(resp.headers["traceparent"])
    assert answer.trace_id == TRACE and answer.span_id != TRACEPARENT.split("-")[2]

    def infer_line(x):
        return x["logger"] == "gunicorn.access" and x["path"].endswith("/infer")

    gateway = json_lines(stack.log_path)
    (access,) = [x for x in gateway if infer_line(x)]
    assert access["status"] == 200 and access["request_id"] == TRACE
    assert any(x["logger"].startswith("gnn_faas.") and x["level"] == "info" for x in gateway)
    assert any("listening on" in x["msg"] for x in gateway)
    for kind, path, ready in (
        ("memory", "/v1/aggregate", "memory function ready"),
        ("compute", "/v1/update", "compute function ready"),
    ):

        def mine(x, path=path):
            return x["logger"] == "gunicorn.access" and x.get("request_id") == TRACE

        lines = wait_for(f"gnn-faas-instances-*/{MODEL}-{kind}*.log", tmp, mine)
        calls = [x for x in lines if mine(x)]
        assert calls and all(x["status"] == 200 for x in calls), kind
        assert path in {x["path"] for x in calls}, kind
        assert any(x["logger"] == f"gnn_faas.{kind}" and ready in x["msg"] for x in lines), kind

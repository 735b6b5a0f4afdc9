"""The gateway's HTTP layer against a live gateway (real function processes):
the Open Inference Protocol with JSON and with the binary tensor data extension
(tritonclient.http with its defaults, unmodified), requested outputs, kinds,
error statuses with JSON bodies, and the OpenAPI document."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gnn_faas.errors import Unavailable

pytestmark = pytest.mark.slow  # a live gateway with real function processes
RTOL, ATOL = 1e-4, 1e-5


def infer_json(gw, inputs, **extra) -> requests.Response:
    return requests.post(
        f"{gw.url}/v2/models/{gw.model}/infer",
        data=json.dumps({"inputs": inputs, **extra}),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )


def tensor(name, data):
    return {"name": name, "datatype": "INT64", "shape": list(np.shape(data)), "data": data}


def outputs(resp: requests.Response) -> dict[str, np.ndarray]:
    assert resp.status_code == 200, resp.text
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in resp.json()["outputs"]}


@pytest.fixture(scope="module")
def triton(live_gateway):
    client = httpclient.InferenceServerClient(live_gateway.url.removeprefix("http://"))
    yield client
    client.close()


CASES = {
    "vertex": [("targets", np.array([7, 1, 7, 300]))],
    "edge": [("pairs", np.array([[1, 2], [5, 9], [2, 1]]))],
    "graph": [("vertices", np.array([3, 4, 10, 11, 12])), ("graph_ids", np.array([0, 0, 1, 1, 1]))],
}
OUTPUT = {"vertex": "embeddings", "edge": "scores", "graph": "readout"}


def expected(gw, kind: str) -> np.ndarray:
    ref = gw.reference
    if kind == "vertex":
        return ref[[7, 1, 7, 300]]
    if kind == "edge":
        p = CASES["edge"][0][1]
        return 1 / (1 + np.exp(-(ref[p[:, 0]] * ref[p[:, 1]]).sum(1)))
    return np.stack([ref[[3, 4]].mean(0), ref[[10, 11, 12]].mean(0)])


@pytest.mark.parametrize("kind", list(CASES))
def test_tritonclient_defaults_equal_the_json_path(live_gateway, triton, kind):
    """tritonclient sends binary inputs and asks for binary outputs by default."""
    gw = live_gateway
    inputs = []
    for name, arr in CASES[kind]:
        inp = httpclient.InferInput(name, list(arr.shape), "INT64")
        inp.set_data_from_numpy(arr)  # binary_data=True: the default
        inputs.append(inp)
    result = triton.infer(gw.model, inputs)  # no outputs named: all, binary
    got = result.as_numpy(OUTPUT[kind])
    assert got is not None and got.dtype == np.float32
    assert result.get_output(OUTPUT[kind])["parameters"]["binary_data_size"] == got.nbytes
    by_json = outputs(infer_json(gw, [tensor(n, a.tolist()) for n, a in CASES[kind]]))
    np.testing.assert_allclose(got, by_json[OUTPUT[kind]], RTOL, ATOL)
    np.testing.assert_allclose(got, expected(gw, kind), RTOL, ATOL)
    # a requested output with InferRequestedOutput's defaults (binary_data=True)
    result = triton.infer(gw.model, inputs, outputs=[httpclient.InferRequestedOutput(OUTPUT[kind])])
    np.testing.assert_allclose(result.as_numpy(OUTPUT[kind]), got, RTOL, ATOL)
    assert [o["name"] for o in result.get_response()["outputs"]] == [OUTPUT[kind]]


def test_tritonclient_metadata_and_health(live_gateway, triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready(live_gateway.model)
    meta = triton.get_model_metadata(live_gateway.model)
    assert {i["name"] for i in meta["inputs"]} == {"targets", "pairs", "vertices", "graph_ids"}
    assert "binary_tensor_data" in triton.get_server_metadata()["extensions"]
    with pytest.raises(InferenceServerException, match="unknown output 'nope'"):
        inp = httpclient.InferInput("targets", [1], "INT64")
        inp.set_data_from_numpy(np.array([1]))
        triton.infer(live_gateway.model, [inp], outputs=[httpclient.InferRequestedOutput("nope")])


def test_versioned_routes_serve_the_listed_version_and_404_another(live_gateway, triton):
    """OIP's /v2/models/{m}/versions/{v}[/ready|/infer]: the version the metadata
    lists answers as the unversioned routes (tritonclient with model_version, and
    plain JSON); any other version is a JSON 404 naming the versions served."""
    gw = live_gateway
    base = f"{gw.url}/v2/models/{gw.model}"
    meta = requests.get(base, timeout=10).json()
    assert meta["versions"] == ["1"]
    assert meta["parameters"]["fanouts"] is None  # served with full neighbourhoods
    assert requests.get(f"{base}/versions/1", timeout=10).json() == meta
    assert triton.get_model_metadata(gw.model, model_version="1") == meta
    assert triton.is_model_ready(gw.model, model_version="1")
    inp = httpclient.InferInput("targets", [2], "INT64")
    inp.set_data_from_numpy(np.array([7, 1]))
    result = triton.infer(gw.model, [inp], model_version="1")
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("embeddings"), gw.reference[[7, 1]], RTOL, ATOL)
    body = {"inputs": [tensor("targets", [7, 1])]}
    plain = requests.post(f"{base}/infer", json=body, timeout=60).json()
    assert "model_version" not in plain
    for method, suffix in (("GET", ""), ("GET", "/ready"), ("POST", "/infer")):
        r = requests.request(method, f"{base}/versions/2{suffix}", json=body, timeout=10)
        assert r.status_code == 404, (suffix, r.text)
        assert r.json()["error"] == f"model '{gw.model}' has no version '2'; versions: 1"
    r = requests.post(f"{gw.url}/v2/models/nope/versions/1/infer", json=body, timeout=10)
    assert r.status_code == 404 and "unknown model 'nope'" in r.json()["error"]


def test_answers_carry_the_request_id_continued_from_the_client(live_gateway):
    """W3C trace context: a valid client traceparent keeps its trace id (the
    gateway answers with a span of its own); a malformed or absent one gets a
    new trace; errors carry it too."""
    gw = live_gateway
    url = f"{gw.url}/v2/models/{gw.model}/infer"
    body = {"inputs": [tensor("targets", [3])]}
    sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = requests.post(url, json=body, headers={"traceparent": sent}, timeout=60)
    assert r.status_code == 200
    version, trace, span, flags = r.headers["traceparent"].split("-")
    assert (version, trace, flags) == ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01")
    assert len(span) == 16 and span != "00f067aa0ba902b7"
    seen = set()
    for headers in ({}, {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}):
        r = requests.post(url, json=body, headers=headers, timeout=60)
        version, trace, span, flags = r.headers["traceparent"].split("-")
        assert len(trace) == 32 and trace != "0" * 32 and flags == "00"
        seen.add(trace)
    assert len(seen) == 2  # a new id per request
    r = requests.post(f"{gw.url}/v2/models/nope/infer", json=body, headers={"traceparent": sent})
    assert r.status_code == 404 and r.headers["traceparent"].split("-")[1] == sent.split("-")[1]


def test_requested_outputs_and_strict_shapes(live_gateway):
    gw = live_gateway
    pairs = [[1, 2], [5, 9]]
    resp = infer_json(gw, [tensor("pairs", pairs)], outputs=[{"name": "scores"}])
    assert [o["name"] for o in resp.json()["outputs"]] == ["scores"]
    for inputs, extra, message in [
        ([tensor("targets", [1])], {"outputs": [{"name": "scores"}]}, "unknown output 'scores'"),
        ([tensor("pairs", pairs)], {"outputs": [{"name": "nope"}]}, "unknown output 'nope'"),
        (
            [{"name": "pairs", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3]]}],
            {},
            "does not match shape",
        ),
        (
            [{"name": "targets", "datatype": "FP32", "shape": [1], "data": [1.0]}],
            {},
            "datatype 'FP32'",
        ),
        (
            [{"name": "targets", "datatype": "INT64", "shape": [3], "data": [1, 2]}],
            {},
            "needs 3 values",
        ),
    ]:
        resp = infer_json(gw, inputs, **extra)
        assert resp.status_code == 400, resp.text
        assert message in resp.json()["error"]


def test_errors_are_json_with_the_right_status(live_gateway, monkeypatch):
    gw = live_gateway
    url = f"{gw.url}/v2/models/{gw.model}/infer"
    deep = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = requests.post(url, data=deep, timeout=30)
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]
    r = requests.post(url, data=b"x" * (gw.plane.serving.limits.max_body_bytes + 1), timeout=30)
    assert r.status_code == 413 and r.json()["error"]
    r = requests.get(f"{gw.url}/v2/models/nope", timeout=10)
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    r = requests.get(f"{gw.url}/v1/status", params={"window_start": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]
    runtime = gw.plane.model(gw.model)

    def overloaded(body):
        raise Unavailable("too busy")

    monkeypatch.setattr(runtime, "infer", overloaded)
    r = requests.post(url, json={"inputs": [tensor("targets", [1])]}, timeout=10)
    assert r.status_code == 503 and r.json() == {"error": "too busy"}
    assert int(r.headers["Retry-After"]) >= 1

    def bug(body):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(runtime, "infer", bug)
    r = requests.post(url, json={"inputs": [tensor("targets", [1])]}, timeout=10)
    assert r.status_code == 500 and "ZeroDivisionError" in r.json()["error"]
    assert "Traceback" not in r.text


def test_openapi_document_describes_every_endpoint(live_gateway):
    doc = requests.get(f"{live_gateway.url}/v2/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.")
    routes = {
        str(rule)
        .replace("<name>", "{name}")
        .replace("<version>", "{version}")
        .replace("<graph>", "{graph}")
        for rule in live_gateway.app.url_map.iter_rules()
        if rule.endpoint != "static"
    }
    assert routes == set(doc["paths"])
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert infer["parameters"][0]["name"] == "Inference-Header-Content-Length"


def _comparable(r: requests.Response) -> tuple:
    """What an answer must share across the two paths: status, content type,
    Retry-After, and the body (an answer's per-request figures and ids aside)."""
    head = (r.status_code, r.headers["Content-Type"].split(";")[0], r.headers.get("Retry-After"))
    n = int(r.headers.get("Inference-Header-Content-Length", len(r.content)))
    body = json.loads(r.content[:n])
    body.pop("id", None)
    body.pop("parameters", None)
    return head + (json.dumps(body, sort_keys=True), r.content[n:])  # binary tensors as bytes


def test_the_dispatcher_answers_inference_as_the_flask_view(live_gateway):
    """Production serves inference through the FrameDispatcher (no Flask); the
    Flask view answers the same requests identically: answers (JSON and binary
    tensor data, versioned), client errors, unknown models and versions, bodies
    over the limit, and every answer timed and traced. A chunked body and a
    percent-escaped path go to Flask through the dispatcher too."""
    gw = live_gateway
    limit = gw.plane.serving.limits.max_body_bytes
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "targets",
                    "datatype": "INT64",
                    "shape": [2],
                    "parameters": {"binary_data_size": 16},
                }
            ],
            "outputs": [{"name": "embeddings", "parameters": {"binary_data": True}}],
        }
    )
    binary = head.encode() + np.array([7, 1], "<i8").tobytes()
    json_headers = {"Content-Type": "application/json"}
    cases = [  # (path, body, headers)
        (f"/v2/models/{gw.model}/infer", json.dumps({"inputs": [tensor("targets", [7, 1])]}),
         json_headers),
        (f"/v2/models/{gw.model}/versions/1/infer",
         json.dumps({"inputs": [tensor("pairs", [[1, 2]])]}), json_headers),
        (f"/v2/models/{gw.model}/infer", binary,
         {"Content-Type": "application/octet-stream",
          "Inference-Header-Content-Length": str(len(head))}),
        (f"/v2/models/{gw.model}/infer", '{"inputs": [{"name": "targets"}]}', json_headers),
        (f"/v2/models/{gw.model}/infer", "not json", json_headers),
        (f"/v2/models/{gw.model}/versions/9/infer", "{}", json_headers),
        ("/v2/models/nope/infer", "{}", json_headers),
        (f"/v2/models/{gw.model}/infer", "x" * (limit + 1), json_headers),
    ]  # fmt: skip
    before = gw.app.extensions["gnn_faas_timer"].as_dict()["requests"]
    for path, body, headers in cases:
        fast = requests.post(gw.url + path, data=body, headers=headers, timeout=60)
        slow = requests.post(gw.flask_url + path, data=body, headers=headers, timeout=60)
        assert _comparable(fast) == _comparable(slow), (path, fast.text[:200], slow.text[:200])
        for r in (fast, slow):
            assert "app;dur=" in r.headers["Server-Timing"] and r.headers["traceparent"]
    assert gw.app.extensions["gnn_faas_timer"].as_dict()["requests"] - before == 2 * len(cases)
    statuses = [requests.post(gw.url + p, data=b, headers=h, timeout=60).status_code
                for p, b, h in cases]  # fmt: skip
    assert statuses == [200, 200, 200, 400, 400, 404, 404, 413]

    # a chunked body (no declared length) is Flask's: the same answer
    def chunks():
        yield json.dumps({"inputs": [tensor("targets", [7, 1])]}).encode()

    url = f"/v2/models/{gw.model}/infer"
    chunked = requests.post(gw.url + url, data=chunks(), headers=json_headers, timeout=60)
    assert _comparable(chunked) == _comparable(
        requests.post(gw.flask_url + url, data=chunks(), headers=json_headers, timeout=60)
    )
    np.testing.assert_allclose(outputs(chunked)["embeddings"], gw.reference[[7, 1]], RTOL, ATOL)
    escaped = requests.post(f"{gw.url}/v2/models/{gw.model[0]}%{ord(gw.model[1]):02X}"
                            f"{gw.model[2:]}/infer", data=cases[0][1], headers=json_headers,
                            timeout=60)  # fmt: skip
    np.testing.assert_allclose(outputs(escaped)["embeddings"], gw.reference[[7, 1]], RTOL, ATOL)


def test_non_finite_query_numbers_are_400(live_gateway):
    for value in ("inf", "-inf", "nan", "1e400", "x"):
        r = requests.get(f"{live_gateway.url}/v1/status", params={"window_end": value}, timeout=30)
        assert r.status_code == 400, value
        assert "finite number" in r.json()["error"]
    ok = requests.get(f"{live_gateway.url}/v1/status", params={"window_end": "1.5"}, timeout=30)
    assert ok.status_code == 200


def test_options_and_405_name_the_methods_of_each_route(live_gateway):
    infer = f"{live_gateway.url}/v2/models/{live_gateway.model}/infer"
    r = requests.options(infer, timeout=30)
    assert (r.status_code, r.headers["Allow"]) == (204, "OPTIONS, POST")
    r = requests.get(infer, timeout=30)
    assert r.status_code == 405 and r.headers["Allow"] == "OPTIONS, POST" and r.json()["error"]
    r = requests.delete(f"{live_gateway.url}/v2/health/live", timeout=30)
    assert r.status_code == 405 and "GET" in r.headers["Allow"]


def test_idle_expiry_keeps_min_instances_and_readiness(live_gateway, monkeypatch):
    """An hour idle: keep-alive stops nothing below min_instances, the gateway
    stays ready and answers without a cold start."""
    rt = live_gateway.plane.models[live_gateway.model]
    pools = [pool for pool, _ in rt.functions.pools]
    before = [len(p.instances()) for p in pools]
    assert all(n >= p.min_instances >= 1 for n, p in zip(before, pools))

    class AnHourLater:
        @staticmethod
        def now() -> float:
            return time.monotonic() + 3600.0

    monkeypatch.setattr(rt, "clock", AnHourLater)
    rt.expire_idle()
    assert [len(p.instances()) for p in pools] >= [p.min_instances for p in pools]
    assert rt.ready() and live_gateway.plane.ready()
    assert requests.get(f"{live_gateway.url}/v2/health/ready", timeout=30).status_code == 200
    monkeypatch.undo()
    launches = [p.stats["launches"] for p in pools]
    r = infer_json(live_gateway, [tensor("targets", [1, 2])])
    assert r.status_code == 200, r.text
    assert [p.stats["launches"] for p in pools] == launches  # served warm: no cold start

"""The gateway client's wire format against the gateway's own parser and
encoder (every request kind, JSON and binary tensor data, new vertices), its
errors by status (a 503 is Unavailable, never a bad request), and its import
staying out of ``import gnn_faas``. The client against a live gateway:
tests/gateway/test_gateway_client.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from gnn_faas import client
from gnn_faas.errors import (
    GnnFaasError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from gnn_faas.gateway.inference_request import (
    InferResponse,
    RawInferRequest,
    parse_infer_request,
)
from gnn_faas.gateway.new_vertices import parse_new_vertices, split_new_vertex_inputs
from gnn_faas.ports import free_port

NUM_NODES = 1000
FEATS = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
BODIES = {
    "vertex": client.vertex_request([7, 1, 7], "r1"),
    "edge": client.edge_request([[1, 2], [5, 9]]),
    "graph": client.graph_request([3, 4, 10], [0, 0, 1]),
    "new vertices": client.new_vertex_request([1000, 5], FEATS, [[5, 1000], [1001, 5]]),
}


def parsed(body: dict, binary: bool):
    """The gateway's reading of the client's bytes: the request and its new vertices."""
    data, headers = client.encode(body, binary)
    raw = RawInferRequest(data, headers.get(client.HEADER_LENGTH))
    rest, new = split_new_vertex_inputs(raw)
    overlay = parse_new_vertices(new, NUM_NODES, 3, symmetrized=False)
    n = NUM_NODES + (0 if overlay is None else overlay.num_new)
    return parse_infer_request("m", rest, n, 64), overlay


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("name", list(BODIES))
def test_requests_parse_as_the_gateway_reads_them(name, binary):
    body = BODIES[name]
    req, overlay = parsed(body, binary)
    assert req.kind == ("vertex" if name == "new vertices" else name)
    for entry in body["inputs"]:
        if entry["name"] not in ("features", "edges"):
            want = np.asarray(entry["data"]).reshape(entry["shape"])
            np.testing.assert_array_equal(req.tensors[entry["name"]], want)
    if name == "new vertices":
        np.testing.assert_array_equal(overlay.features, FEATS)
        assert overlay.num_new == 2
    else:
        assert overlay is None
    # binary asks for every output in binary too; JSON for none
    assert bool(req.binary_outputs) == binary
    assert req.id == "r1" if name == "vertex" else req.id_from_client is False


def test_named_outputs_are_asked_for():
    body = {**client.vertex_request([1]), "outputs": [{"name": "predictions"}]}
    req = parse_infer_request("m", body, NUM_NODES, 64, task="vertex")
    assert req.output_names == ("predictions",)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_answers_decode_to_the_arrays_the_gateway_sent(binary):
    scores = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    preds = np.array([2, 0, 3], np.int64)
    resp = InferResponse(
        "m", "r1", [("scores", scores), ("predictions", preds)], {"latency_ms": 1.5},
        binary=frozenset({"scores", "predictions"}) if binary else frozenset(),
    )  # fmt: skip
    content, headers = resp.encode()
    got = client.decode(content, headers.get(client.HEADER_LENGTH))
    assert (got.model, got.id, got.parameters) == ("m", "r1", {"latency_ms": 1.5})
    np.testing.assert_array_equal(got.outputs["scores"], scores)
    np.testing.assert_array_equal(got.outputs["predictions"], preds)
    assert got.outputs["scores"].dtype == np.float32
    assert got.outputs["predictions"].dtype == np.int64


@pytest.mark.parametrize(
    ("status", "cls"),
    [(400, InvalidRequest), (404, NotFound), (413, PayloadTooLarge), (408, InvalidRequest),
     (503, Unavailable), (502, GnnFaasError), (500, GnnFaasError)],
)  # fmt: skip
def test_errors_by_status(status, cls):
    exc = client.error_for(status, "why", "7")
    assert type(exc) is cls and exc.http_status == status and "why" in str(exc)
    # a 503 is worth retrying: never a bad request; a 5xx is not the client's fault
    assert isinstance(exc, InvalidRequest) == (400 <= status < 500 and status != 404)
    if status == 503:
        assert exc.retry_after_s == 7.0


def test_an_unreachable_gateway_is_unavailable():
    with client.GatewayClient(f"http://127.0.0.1:{free_port()}", timeout_s=2) as gw:
        with pytest.raises(Unavailable, match="unreachable"):
            gw.status()
        assert gw.ready() is False


def test_the_package_exports_the_client_without_importing_it():
    code = (
        "import sys, gnn_faas; assert 'requests' not in sys.modules, 'eager import'; "
        "from gnn_faas import GatewayClient, InferResult; "
        "assert GatewayClient.__module__ == 'gnn_faas.client'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_invoke_says_unavailable_and_exits_3(capsys):
    from gnn_faas.cli import main

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["invoke", "m", "--targets", "1", "--url", url, "--timeout", "2"]) == 3
    assert "unavailable, retry in" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--pairs", "1", "2", "3"], "even number"),
     (["--targets", "1", "--graph-ids", "0"], "--graph-ids needs --vertices"),
     (["--targets", "1", "--new-edges", "1", "2"], "--new-edges needs --new-features")],
)  # fmt: skip
def test_invoke_usage_errors(capsys, argv, message):
    from gnn_faas.cli import main

    assert main(["invoke", "m", *argv, "--url", "http://127.0.0.1:1"]) == 2
    assert message in capsys.readouterr().err

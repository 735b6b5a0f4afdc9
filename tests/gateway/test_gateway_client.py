"""gnn_faas.client.GatewayClient against a live gateway (real function
processes, tests/gateway/conftest.py): every request kind, JSON and binary,
equal to PyG's answer on the whole graph; new vertices; status and metadata;
a shed request raised as Unavailable; ``gnn-faas invoke`` through it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.client import GatewayClient
from gnn_faas.errors import InvalidRequest, NotFound, Unavailable

pytestmark = pytest.mark.slow  # a live gateway with real function processes
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def gw_client(live_gateway):
    with GatewayClient(live_gateway.url, timeout_s=60) as gw:
        yield gw


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_every_kind_equals_the_reference(live_gateway, gw_client, binary):
    ref, model = live_gateway.reference, live_gateway.model
    got = gw_client.infer_vertices(model, [7, 1, 300], binary=binary).outputs["embeddings"]
    np.testing.assert_allclose(got, ref[[7, 1, 300]], RTOL, ATOL)
    pairs = np.array([[1, 2], [5, 9]])
    got = gw_client.infer_edges(model, pairs, binary=binary).outputs["scores"]
    want = 1 / (1 + np.exp(-(ref[pairs[:, 0]] * ref[pairs[:, 1]]).sum(1)))
    np.testing.assert_allclose(got, want, RTOL, ATOL)
    got = gw_client.infer_graphs(model, [3, 4, 10, 11], [0, 0, 1, 1], binary=binary)
    want = np.stack([ref[[3, 4]].mean(0), ref[[10, 11]].mean(0)])
    np.testing.assert_allclose(got.outputs["readout"], want, RTOL, ATOL)
    assert got.model == model and got.parameters["latency_ms"] > 0


def test_new_vertices(live_gateway, gw_client):
    """A new vertex without edges leaves stored vertex 7's answer as stored; one
    with an edge from 12 answers the same through JSON and binary."""
    model, n = live_gateway.model, live_gateway.num_nodes
    meta = gw_client.metadata(model)
    assert meta["parameters"]["new_vertex_ids_from"] == n
    dim = live_gateway.plane.model(model).graph.manifest.feature_dim
    feats = np.random.default_rng(1).standard_normal((1, dim)).astype(np.float32)
    alone = gw_client.infer_vertices(model, [7, n], features=feats, edges=[])
    np.testing.assert_allclose(
        alone.outputs["embeddings"][0], live_gateway.reference[7], RTOL, ATOL
    )
    answers = [
        gw_client.infer_vertices(model, [n], features=feats, edges=[[12, n]], binary=b)
        for b in (False, True)
    ]
    rows = [a.outputs["embeddings"] for a in answers]
    np.testing.assert_allclose(rows[0], rows[1], RTOL, ATOL)
    # the edge from 12 changes the new vertex's answer
    assert not np.allclose(rows[0][0], alone.outputs["embeddings"][1], RTOL, ATOL)


def test_status_models_and_client_errors(live_gateway, gw_client):
    assert gw_client.models() == [live_gateway.model]
    assert gw_client.ready()
    status = gw_client.status()
    assert status["ready"] and {m["model"] for m in status["models"]} == {live_gateway.model}
    with pytest.raises(InvalidRequest, match="HTTP 400") as bad:
        gw_client.infer_vertices(live_gateway.model, [10**9])
    assert not isinstance(bad.value, Unavailable)
    with pytest.raises(NotFound, match="HTTP 404"):
        gw_client.infer_vertices("nope", [1])


def test_a_shed_request_is_unavailable_not_bad(live_gateway, gw_client, monkeypatch):
    runtime = live_gateway.plane.model(live_gateway.model)

    def overloaded(body):
        raise Unavailable("too busy")

    monkeypatch.setattr(runtime, "infer", overloaded)
    with pytest.raises(Unavailable, match="too busy") as shed:
        gw_client.infer_vertices(live_gateway.model, [1])
    assert not isinstance(shed.value, InvalidRequest)
    assert shed.value.http_status == 503 and shed.value.retry_after_s >= 1


def test_invoke_prints_the_answer(live_gateway, capsys):
    url, model = live_gateway.url, live_gateway.model
    assert main(["invoke", model, "--pairs", "1", "2", "5", "9", "--url", url, "--binary"]) == 0
    answer = json.loads(capsys.readouterr().out)
    ref = live_gateway.reference
    want = 1 / (1 + np.exp(-(ref[[1, 5]] * ref[[2, 9]]).sum(1)))
    np.testing.assert_allclose(answer["outputs"]["scores"], want, RTOL, ATOL)
    assert main(["invoke", model, "--targets", "999999", "--url", url]) == 2
    assert "HTTP 400" in capsys.readouterr().err

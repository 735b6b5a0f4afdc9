"""Hostile input at a live gateway: validation comes before admission (a 503
means only "valid, but not now"), FP32 overflow is refused where it is decoded,
and a result that overflowed is a logged 500, never NaN in the body."""

from __future__ import annotations

import json
import logging

import pytest
import requests

from gnn_faas.gateway.admission import Decision

pytestmark = pytest.mark.slow


def _post(gw, body: bytes | dict):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(
        f"{gw.url}/v2/models/{gw.model}/infer",
        data=data,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )


def _targets(ids):
    return {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [len(ids)], "data": ids}]}


@pytest.fixture
def shedding(live_gateway, monkeypatch):
    """Admission that sheds every request it is asked about."""
    runtime = live_gateway.plane.model(live_gateway.model)
    monkeypatch.setattr(
        runtime.admission,
        "decide",
        lambda accepted_at=None: Decision(False, 9.0, 0.0, 99, 1.0, retry_after_s=2),
    )
    return live_gateway


INVALID = [
    {"inputs": {}},
    {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [], "data": []}]},
    {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [1], "data": [-4]}]},
    {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [2], "data": [1]}]},
    b'{"inputs": [',
]


@pytest.mark.parametrize("body", INVALID, ids=range(len(INVALID)))
def test_invalid_requests_are_400_even_when_the_gateway_sheds(shedding, body):
    r = _post(shedding, body)
    assert r.status_code == 400, r.text
    assert "Retry-After" not in r.headers and r.json()["error"]


def test_a_valid_request_is_shed_with_503_when_overloaded(shedding):
    r = _post(shedding, _targets([1, 2]))
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"


def _with_new_vertex(gw, value: float) -> dict:
    dim = gw.plane.model(gw.model).graph.manifest.feature_dim
    body = _targets([gw.num_nodes])  # the new vertex itself
    body["inputs"] += [
        {"name": "features", "datatype": "FP32", "shape": [1, dim], "data": [value] * dim},
        {"name": "edges", "datatype": "INT64", "shape": [2, 2],
         "data": [0, gw.num_nodes, gw.num_nodes, 1]},
    ]  # fmt: skip
    return body


@pytest.mark.parametrize("value", [1e39, -1e39, 3.5e38])
def test_features_beyond_fp32_are_refused_at_decode(live_gateway, value):
    r = _post(live_gateway, _with_new_vertex(live_gateway, value))
    assert r.status_code == 400
    assert "finite FP32" in r.json()["error"]


def test_an_overflowing_result_is_a_logged_500_and_never_nan(live_gateway, caplog):
    # finite FP32 features at the top of the range: the layers' sums overflow
    with caplog.at_level(logging.ERROR, logger="gnn_faas.http"):
        r = _post(live_gateway, _with_new_vertex(live_gateway, 3.4e38))
    assert r.status_code == 500
    body = r.json()  # strict JSON: json.loads would take NaN, so check the text too
    assert "NaN" not in r.text and "Infinity" not in r.text
    assert "non-finite" in body["error"]
    assert any("non-finite" in rec.getMessage() for rec in caplog.records)

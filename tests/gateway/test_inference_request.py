"""OIP v2 request parsing: valid vertex/edge/graph requests and every error class."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, PayloadTooLarge
from gnn_faas.gateway.inference_request import make_infer_response, parse_infer_request

N = 5881  # Bitcoin OTC's vertices
MAX = 64


def body(inputs, **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


def tensor(name, data, shape=None, datatype="INT64"):
    if shape is None:
        shape = list(np.shape(data))
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def test_vertex_request():
    req = parse_infer_request(
        "bitcoin-otc",
        body(
            [tensor("targets", [42, 7, 42, 5880])],
            id="r-1",
            parameters={"hops": 2},
            outputs=[{"name": "scores"}],
        ),
        N,
        MAX,
    )
    assert req.kind == "vertex" and req.model == "bitcoin-otc" and req.id == "r-1"
    assert req.id_from_client
    assert req.targets.dtype == np.int64
    assert req.targets.tolist() == [7, 42, 5880]
    assert req.vertices.tolist() == [42, 7, 42, 5880]
    assert req.pairs is None and req.graph_ids is None
    assert req.output_names == ("scores",)
    assert req.parameters == {"hops": 2}


def test_vertex_request_int32_str_and_dict_bodies():
    doc = {"inputs": [tensor("targets", [3, 1], datatype="INT32")]}
    for b in (doc, json.dumps(doc), json.dumps(doc).encode()):
        req = parse_infer_request("m", b, N, MAX)
        assert req.targets.tolist() == [1, 3]
        assert not req.id_from_client and len(req.id) == 32  # generated


def test_edge_request_flat_and_nested_data():
    flat = parse_infer_request("m", body([tensor("pairs", [1, 2, 3, 4], shape=[2, 2])]), N, MAX)
    nested = parse_infer_request("m", body([tensor("pairs", [[1, 2], [3, 4]])]), N, MAX)
    for req in (flat, nested):
        assert req.kind == "edge"
        assert req.pairs.tolist() == [[1, 2], [3, 4]]
        assert req.vertices.tolist() == [1, 2, 3, 4]
        assert req.targets.tolist() == [1, 2, 3, 4]


def test_graph_request_with_and_without_graph_ids():
    req = parse_infer_request(
        "m",
        body([tensor("vertices", [9, 4, 4, 1]), tensor("graph_ids", [0, 0, 1, 1])]),
        N,
        MAX,
    )
    assert req.kind == "graph" and req.num_graphs == 2
    assert req.graph_ids.tolist() == [0, 0, 1, 1]
    assert req.targets.tolist() == [1, 4, 9]
    single = parse_infer_request("m", body([tensor("vertices", [9, 4])]), N, MAX)
    assert single.graph_ids.tolist() == [0, 0] and single.num_graphs == 1


BAD = [
    (b"{not json", "malformed JSON"),
    (b"", "body is empty"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    (json.dumps({"id": "x"}).encode(), "missing 'inputs'"),
    (json.dumps({"inputs": []}).encode(), "'inputs' is empty"),
    (json.dumps({"inputs": {"name": "targets"}}).encode(), "'inputs' must be a list"),
    (
        json.dumps({"inputs": [{"name": "targets", "shape": [1], "data": [1]}]}).encode(),
        "no 'datatype'",
    ),
    (body([tensor("targets", [1.0, 2.0], datatype="FP32")]), "datatype 'FP32'"),
    (body([tensor("targets", [True], datatype="BOOL")]), "datatype 'BOOL'"),
    (body([tensor("targets", [1.0, 2.0])]), "must hold integers, found 1.0"),
    (body([tensor("targets", [1, True])]), "must hold integers, found True"),
    (body([tensor("targets", ["3"])]), "must hold integers, found '3'"),
    (body([tensor("targets", [1, 2, 3], shape=[2])]), "needs 2 values, 'data' has 3"),
    (body([tensor("targets", [1, 2], shape=[1, 2])]), "must have shape [n]"),
    (body([tensor("targets", [1], shape="1")]), "'shape' must be"),
    (body([tensor("targets", [4, -1, 6000])]), "out of range [0, 5881): -1, 6000"),
    (body([tensor("targets", [5881])]), "out of range [0, 5881): 5881"),
    (body([tensor("targets", [], shape=[0])]), "is empty"),
    (body([tensor("targets", [2**40], datatype="INT32")]), "does not fit INT32"),
    (body([tensor("nodes", [1])]), "no recognised input"),
    (body([tensor("targets", [1]), tensor("pairs", [[1, 2]])]), "mix request kinds"),
    (body([tensor("targets", [1]), tensor("extra", [1])]), "unexpected input(s) ['extra']"),
    (body([tensor("targets", [1]), tensor("targets", [2])]), "given twice"),
    (body([tensor("pairs", [1, 2, 3], shape=[3])]), "must have shape [k, 2]"),
    (body([tensor("pairs", [1, 2, 3], shape=[1, 3])]), "must have shape [k, 2]"),
    (body([tensor("vertices", [1, 2]), tensor("graph_ids", [0])]), "one graph id per vertex"),
    (
        body([tensor("vertices", [1, 2]), tensor("graph_ids", [0, 2])]),
        "no vertex has graph id(s) [1]",
    ),
    (body([tensor("vertices", [1, 2]), tensor("graph_ids", [0, -1])]), "must be >= 0"),
    (body([tensor("targets", [1])], id=7), "'id' must be a string"),
    (body([tensor("targets", [1])], parameters=[1]), "'parameters' must be a JSON object"),
    (body([tensor("targets", [1])], outputs=[{"x": 1}]), "outputs[0]"),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
def test_invalid_requests(raw, message):
    with pytest.raises(InvalidRequest) as err:
        parse_infer_request("m", raw, N, MAX)
    assert message in str(err.value)
    assert err.value.http_status == 400


@pytest.mark.parametrize(
    "inputs",
    [
        [tensor("targets", list(range(MAX + 1)))],
        [tensor("pairs", [[i, i + 1] for i in range(MAX // 2 + 1)])],
        [tensor("vertices", list(range(MAX + 1)))],
    ],
)
def test_too_many_ids_is_413(inputs):
    with pytest.raises(PayloadTooLarge) as err:
        parse_infer_request("m", body(inputs), N, MAX)
    assert err.value.http_status == 413
    assert f"at most {MAX}" in str(err.value)


def test_make_infer_response_is_oip_json():
    scores = np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32)
    ids = np.array([3, 9], dtype=np.int64)
    resp = make_infer_response("bitcoin-otc", "r-1", {"scores": scores, "targets": ids})
    back = json.loads(json.dumps(resp))
    assert back["model_name"] == "bitcoin-otc" and back["id"] == "r-1"
    out = {o["name"]: o for o in back["outputs"]}
    assert out["scores"] == {
        "name": "scores",
        "shape": [2, 2],
        "datatype": "FP32",
        "data": [0.25, 0.75, 1.0, 0.0],
    }
    assert out["targets"]["datatype"] == "INT64" and out["targets"]["data"] == [3, 9]
    with pytest.raises(TypeError):
        make_infer_response("m", None, [("c", np.array([1 + 2j]))])

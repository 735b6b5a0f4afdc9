"""OIP v2 request parsing: valid vertex/edge/graph requests and every error class."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from gnn_faas.config import LimitsConfig
from gnn_faas.errors import InvalidRequest, PayloadTooLarge, UnsupportedRequest
from gnn_faas.gateway.inference_request import (
    HEADER_LENGTH,
    InferResponse,
    RawInferRequest,
    decode_infer_response,
    make_infer_response,
    model_signature,
    parse_infer_request,
)

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
        body([tensor("vertices", [1, 2, 3]), tensor("graph_ids", [0, 0, 2])]),
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


# -- hostile values: rejected in time and memory bounded by the request's size ---

HOSTILE = [
    # graph ids far beyond the request: nothing may be sized by them
    (body([tensor("vertices", [1, 2]), tensor("graph_ids", [0, 2**62])]), "must lie in [0, 2)"),
    (body([tensor("vertices", [1, 2]), tensor("graph_ids", [0, 2**63 - 1])]), "must lie in [0, 2)"),
    (body([tensor("vertices", [1, 2]), tensor("graph_ids", [0, 10**30])]), "does not fit INT64"),
    (body([tensor("vertices", [1]), tensor("graph_ids", [-(2**63)])]), "must be >= 0"),
    (body([tensor("targets", [10**30])]), "does not fit INT64"),
    (
        b'{"inputs": [{"name": "targets", "shape": [1], "datatype": "INT64", "data": [1'
        + b"0" * 5000
        + b"]}]}",
        "malformed JSON",
    ),
    # deep nesting: beyond the parser's recursion and beyond the configured depth
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    (b'{"inputs": ' + b"[" * 50 + b"]" * 50 + b"}", "nested deeper than 16"),
    (b'{"parameters": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}", "nested deeper"),
    # ragged or partly nested data must match the shape
    (body([tensor("pairs", [[1, 2], [3]], shape=[2, 2])]), "does not match shape [2, 2]"),
    (body([tensor("pairs", [[1, 2], 3, 4], shape=[2, 2])]), "does not match shape [2, 2]"),
    (body([tensor("pairs", [[[1, 2]], [[3, 4]]], shape=[2, 2])]), "does not match shape"),
    (body([tensor("targets", [[1], [2]], shape=[2])]), "deeper than shape [2]"),
    (body([tensor("targets", [1], shape=[1, 1, 1, 1, 1])]), "at most 4 integers"),
    (body([tensor("targets", [1], datatype=["INT64"])]), "'datatype' must be a string"),
    (body([tensor("targets", [1], datatype="BYTES")]), "datatype 'BYTES'"),
    (body([tensor("targets", [1], shape=[True])]), "non-negative integers"),
    (body([tensor("targets", [1], shape=[-1])]), "non-negative integers"),
    (body([tensor("targets", 5, shape=[1])]), "'data' must be a list"),
    (body([tensor("targets", [1])], id="x" * 300), "longer than 256"),
    (body([tensor("targets", [1])], parameters={str(i): i for i in range(40)}), "more than 32"),
    (body([tensor("targets", [1])], parameters={"a": [1]}), "string, number or boolean"),
    (body([tensor("targets", [1])] * 9), "more than 8"),
    (body([tensor("targets", [1])], parameters={"binary_data_output": "yes"}), "true or false"),
    (body([tensor("targets", [1])], outputs=[{"name": "scores"}] * 2), "requested twice"),
    (body([{"name": "targets", "shape": [1], "datatype": "INT64"}]), "has no 'data'"),
    (body([{**tensor("targets", [1]), "parameters": {"binary_data_size": 8}}]), "both 'data'"),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("raw", "message"), HOSTILE)
def test_hostile_requests_are_400(raw, message):
    with pytest.raises(InvalidRequest) as err:
        parse_infer_request("m", raw, N, MAX)
    assert message in str(err.value)
    assert err.value.http_status == 400


@pytest.mark.timeout(10)
@pytest.mark.parametrize("shape", [[10**18], [2**64], [2**40, 2], [10**4000, 2], [10**4000]])
def test_giant_shapes_with_small_data_are_413_before_data_is_read(shape):
    name = "targets" if len(shape) == 1 else "pairs"
    with pytest.raises(PayloadTooLarge):
        parse_infer_request("m", body([tensor(name, [1, 2], shape=shape)]), N, MAX)


def test_limits_are_configuration():
    small = LimitsConfig(max_body_bytes=200, max_inputs=1, max_id_chars=3)
    with pytest.raises(PayloadTooLarge, match="exceeds 200 bytes"):
        parse_infer_request("m", body([tensor("targets", list(range(40)))]), N, MAX, limits=small)
    with pytest.raises(InvalidRequest, match="more than 1 entries"):
        parse_infer_request(
            "m", body([tensor("vertices", [1]), tensor("graph_ids", [0])]), N, MAX, limits=small
        )
    with pytest.raises(InvalidRequest, match="longer than 3"):
        parse_infer_request("m", body([tensor("targets", [1])], id="abcd"), N, MAX, limits=small)
    with pytest.raises(InvalidRequest, match="positive integer"):
        LimitsConfig(max_json_depth=0)


# -- the request kinds a model answers, and its outputs ---------------------------


@pytest.mark.parametrize(
    ("task", "inputs", "ok"),
    [
        ("vertex", [tensor("targets", [1])], True),
        ("vertex", [tensor("pairs", [[1, 2]])], False),
        ("vertex", [tensor("vertices", [1, 2])], False),
        ("embedding", [tensor("pairs", [[1, 2]])], True),
        ("embedding", [tensor("vertices", [1, 2])], True),
        ("edge", [tensor("vertices", [1, 2])], False),
        ("graph", [tensor("pairs", [[1, 2]])], False),
    ],
)
def test_a_kind_the_model_cannot_answer_is_400(task, inputs, ok):
    if ok:
        assert parse_infer_request("m", body(inputs), N, MAX, task=task).kind
        return
    with pytest.raises(UnsupportedRequest, match="does not answer") as err:
        parse_infer_request("m", body(inputs), N, MAX, task=task)
    assert err.value.http_status == 400


def test_outputs_are_checked_and_selected():
    req = parse_infer_request(
        "m", body([tensor("targets", [3, 1])], outputs=[{"name": "predictions"}]), N, MAX,
        task="vertex",
    )  # fmt: skip
    assert req.output_names == ("predictions",) and req.binary_outputs == frozenset()
    outs = {"scores": np.zeros((2, 2), np.float32), "predictions": np.array([1, 0])}
    assert [n for n, _ in req.select_outputs(outs)] == ["predictions"]
    with pytest.raises(UnsupportedRequest, match="unknown output 'nope'"):
        parse_infer_request(
            "m", body([tensor("targets", [1])], outputs=[{"name": "nope"}]), N, MAX, task="vertex"
        )
    with pytest.raises(UnsupportedRequest, match="unknown output 'scores'"):
        parse_infer_request(
            "m", body([tensor("targets", [1])], outputs=[{"name": "scores"}]), N, MAX,
            task="embedding",
        )  # fmt: skip
    sig = model_signature("vertex", 2)
    assert [i["name"] for i in sig["inputs"]] == ["targets"]
    assert sig["outputs"][0] == {"name": "scores", "datatype": "FP32", "shape": [-1, 2]}
    sig = model_signature("embedding", 16)
    assert [i["name"] for i in sig["inputs"]] == ["targets", "pairs", "vertices", "graph_ids"]
    assert [o["name"] for o in sig["outputs"]] == ["embeddings", "scores", "readout"]


# -- the binary tensor data extension ---------------------------------------------


def binary_body(tensors, json_extra=None, **params):
    """A binary-extension body: (bytes, header length) from (name, array) inputs."""
    inputs, blobs = [], []
    for name, arr, dtype in tensors:
        raw = np.ascontiguousarray(arr, dtype=dtype).tobytes()
        inputs.append(
            {
                "name": name,
                "shape": list(np.shape(arr)),
                "datatype": {"<i8": "INT64", "<i4": "INT32"}[dtype],
                "parameters": {"binary_data_size": len(raw), **params},
            }
        )
        blobs.append(raw)
    head = json.dumps({"inputs": inputs, **(json_extra or {})}).encode()
    return head + b"".join(blobs), len(head)


@pytest.mark.parametrize("dtype", ["<i8", "<i4"])
def test_binary_inputs_equal_json_inputs(dtype):
    pairs = np.array([[1, 2], [5, 9], [2, 1]])
    raw, n = binary_body([("pairs", pairs, dtype)])
    a = parse_infer_request("m", RawInferRequest(raw, str(n)), N, MAX)
    b = parse_infer_request("m", body([tensor("pairs", pairs.tolist())]), N, MAX)
    assert a.kind == b.kind == "edge"
    assert a.pairs.dtype == np.int64 and np.array_equal(a.pairs, b.pairs)
    # graph request: two binary inputs, one after the other
    raw, n = binary_body(
        [("vertices", np.array([4, 9, 9]), dtype), ("graph_ids", [0, 1, 1], dtype)]
    )
    g = parse_infer_request("m", RawInferRequest(raw, n), N, MAX)
    assert g.vertices.tolist() == [4, 9, 9] and g.graph_ids.tolist() == [0, 1, 1]


def test_binary_headers_lying_about_sizes_are_400():
    raw, n = binary_body([("targets", np.array([1, 2, 3]), "<i8")])
    cases = [
        (RawInferRequest(raw, n + 5), "malformed JSON"),
        (RawInferRequest(raw, len(raw) + 1), "non-empty prefix"),
        (RawInferRequest(raw, 0), "non-empty prefix"),
        (RawInferRequest(raw, "12abc"), "must be an integer"),
        (RawInferRequest(raw[:-1], n), "runs past the end"),
        (RawInferRequest(raw + b"\0", n), "1 bytes after the JSON header"),
        (RawInferRequest(raw, None), "Extra data"),
    ]
    # a size that disagrees with shape x datatype
    head = json.loads(raw[:n])
    head["inputs"][0]["shape"] = [2]
    h = json.dumps(head).encode()
    cases.append((RawInferRequest(h + raw[n:], len(h)), "needs 16 bytes, binary_data_size is 24"))
    head["inputs"][0]["shape"] = [3]
    head["inputs"][0]["parameters"]["binary_data_size"] = -1
    h = json.dumps(head).encode()
    cases.append((RawInferRequest(h + raw[n:], len(h)), "non-negative integer"))
    for raw_req, message in cases:
        with pytest.raises(InvalidRequest) as err:
            parse_infer_request("m", raw_req, N, MAX)
        assert message in str(err.value), (raw_req.header_length, str(err.value))
    # out-of-range ids are checked in binary too
    raw, n = binary_body([("targets", np.array([1, N]), "<i8")])
    with pytest.raises(InvalidRequest, match="out of range"):
        parse_infer_request("m", RawInferRequest(raw, n), N, MAX)


@pytest.mark.parametrize(
    ("extra", "binary"),
    [
        ({}, set()),
        ({"parameters": {"binary_data_output": True}}, {"scores", "predictions"}),
        ({"outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}, {"scores"}),
        (
            {
                "parameters": {"binary_data_output": True},
                "outputs": [
                    {"name": "predictions"},
                    {"name": "scores", "parameters": {"binary_data": False}},
                ],
            },
            {"predictions"},
        ),
    ],
)
def test_binary_outputs_round_trip(extra, binary):
    req = parse_infer_request("m", body([tensor("targets", [3, 1])], **extra), N, MAX)
    assert req.binary_outputs == binary
    scores = np.array([[0.25, -1.5], [3.0, 0.0]], np.float32)
    outs = {"scores": scores, "predictions": scores.argmax(1)}
    resp = InferResponse("m", req.id, req.select_outputs(outs), {"x": 1}, req.binary_outputs)
    raw, headers = resp.encode()
    if binary:
        assert headers["Content-Type"] == "application/octet-stream"
        n = int(headers[HEADER_LENGTH])
        head = json.loads(raw[:n])
        sizes = {
            o["name"]: o["parameters"]["binary_data_size"]
            for o in head["outputs"]
            if "parameters" in o
        }
        assert set(sizes) == binary and len(raw) == n + sum(sizes.values())
    else:
        assert HEADER_LENGTH not in headers and json.loads(raw)["outputs"]
    back = decode_infer_response(raw, headers.get(HEADER_LENGTH))
    got = {o["name"]: o["data"] for o in back["outputs"]}
    assert list(got) == [n for n, _ in req.select_outputs(outs)]
    np.testing.assert_array_equal(got["scores"], scores) if "scores" in got else None
    assert got["predictions"].tolist() == [0, 0] if "predictions" in got else True


def test_a_new_input_is_one_row_of_the_table(monkeypatch):
    """A kind with an FP32 values input (as new-vertex requests will need):
    parsed, bounded and checked from its table row alone."""
    from gnn_faas.gateway import inference_request as ir

    kind = ir.RequestKind(
        "vertex",
        (
            ir.InputSpec("targets", ir.ID_DATATYPES, (-1,), "vertex_ids"),
            ir.InputSpec("features", ("FP32",), (-1, 3), "values", required=False),
        ),
        ir.REQUEST_KINDS["vertex"].outputs,
        ir.REQUEST_KINDS["vertex"].outputs_for_vertex_task,
    )
    monkeypatch.setitem(ir.REQUEST_KINDS, "vertex", kind)
    feats = [[0.5, 1, -2.0], [3.0, 4.0, 5.0]]
    ft = tensor("features", feats, datatype="FP32")
    req = parse_infer_request("m", body([tensor("targets", [1]), ft]), N, MAX)
    assert req.tensors["features"].dtype == np.float32
    np.testing.assert_array_equal(req.tensors["features"], np.asarray(feats, np.float32))
    raw = np.asarray(feats, "<f4").tobytes()
    head = json.dumps(
        {
            "inputs": [
                tensor("targets", [1]),
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": len(raw)},
                },
            ]
        }
    ).encode()
    req = parse_infer_request("m", RawInferRequest(head + raw, len(head)), N, MAX)
    np.testing.assert_array_equal(req.tensors["features"], np.asarray(feats, np.float32))
    limits = LimitsConfig(max_values=5)
    for features, error, message in [
        (tensor("features", [[1, 2, 3], [4, 5, 6]], datatype="FP32"), PayloadTooLarge, "at most 5"),
        (tensor("features", [[1, 2, 3]], datatype="FP64"), InvalidRequest, "must be FP32"),
        (tensor("features", [[1, 2, True]], datatype="FP32"), InvalidRequest, "found True"),
        (tensor("features", [[1, 2]], datatype="FP32"), InvalidRequest, "shape [k, 3]"),
        (tensor("features", [[1, 2, 1e300]], datatype="FP32"), InvalidRequest, "finite"),
        (
            tensor("features", [[1, 2, float("nan")]], datatype="FP32"),
            InvalidRequest,
            "NaN is not a JSON number",
        ),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            parse_infer_request(
                "m", body([tensor("targets", [1]), features]), N, MAX, limits=limits
            )

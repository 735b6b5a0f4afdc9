"""New-vertex inputs of an OIP request: parsing, the id convention, 4xx errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, PayloadTooLarge
from gnn_faas.gateway.inference_request import parse_infer_request
from gnn_faas.gateway.new_vertices import (
    NewVertexLimits,
    parse_new_vertices,
    split_new_vertex_inputs,
)

N, D = 10, 3


def body(features=None, edges=None, targets=(N,), over=None):
    inputs = [
        {"name": "targets", "datatype": "INT64", "shape": [len(targets)], "data": list(targets)}
    ]
    if features is not None:
        f = np.asarray(features, dtype=float)
        inputs.append({"name": "features", "datatype": "FP32", "shape": list(f.shape),
                       "data": f.reshape(-1).tolist()})  # fmt: skip
    if edges is not None:
        e = np.asarray(edges)
        inputs.append({"name": "edges", "datatype": "INT64", "shape": list(e.shape),
                       "data": e.reshape(-1).tolist()})  # fmt: skip
    for t in inputs:
        t.update((over or {}).get(t["name"], {}))
    return {"inputs": inputs}


def parse(doc, limits=None, symmetrized=True):
    rest, added = split_new_vertex_inputs(json.dumps(doc).encode())
    ov = parse_new_vertices(added, N, D, symmetrized, limits)
    req = parse_infer_request("m", rest, N if ov is None else ov.num_nodes, max_targets=16)
    return req, ov


def test_new_vertices_get_ids_after_the_stored_ones():
    req, ov = parse(
        body([[1, 2, 3], [4, 5, 6]], [[0, N], [N, N + 1], [3, N + 1]], targets=(N + 1, 2))
    )
    assert ov.num_new == 2 and ov.new_ids.tolist() == [N, N + 1]
    assert req.targets.tolist() == [2, N + 1]
    np.testing.assert_array_equal(ov.rows(np.array([N + 1])), [[4, 5, 6]])
    # symmetrised graph: every edge both ways; N + 1 aggregates from N and 3
    counts, src = ov.in_edges(np.array([N + 1, 0]))
    assert counts.tolist() == [2, 1] and sorted(src[:2].tolist()) == [3, N] and src[2] == N
    _, directed = parse(body([[1, 2, 3]], [[0, N]]), symmetrized=False)
    assert directed.in_degree(np.array([N, 0])).tolist() == [1, 0]


def test_a_request_without_new_inputs_is_untouched():
    doc = body()
    doc["inputs"][0]["data"] = [1]
    rest, added = split_new_vertex_inputs(doc)
    assert rest is doc and added == {}
    assert split_new_vertex_inputs(b"not json") == (b"not json", {})


@pytest.mark.parametrize(
    "doc,error,match",
    [
        (body([[1, 2]]), InvalidRequest, "dimension 2; the graph's features have 3"),
        (body([1, 2, 3]), InvalidRequest, r"shape \[n, d\]"),
        (
            body([[1, 2, 3]], over={"features": {"datatype": "FP64"}}),
            InvalidRequest,
            "must be FP32",
        ),
        (body([[1, 2, 3]], over={"features": {"data": [1, 2]}}), InvalidRequest, "needs 3 values"),
        (
            body([[1, 2, 3]], over={"features": {"data": ["a", 2, 3]}}),
            InvalidRequest,
            "list of numbers",
        ),
        (
            # beyond FP32 (NaN itself is not JSON: the OIP parser refuses it)
            body([[1, 2, 3]], over={"features": {"data": [1, 1e39, 3]}}),
            InvalidRequest,
            "finite FP32",
        ),
        (body([[1, 2, 3]], [[0, N + 1]]), InvalidRequest, r"out of range \[0, 11\)"),
        (body([[1, 2, 3]], [[-1, N]]), InvalidRequest, "out of range"),
        (body([[1, 2, 3]], [[N, N]]), InvalidRequest, "self-loops"),
        (body([[1, 2, 3]], [[0, N, 1]]), InvalidRequest, r"\[m, 2\]"),
        (
            body([[1, 2, 3]], [[0, N]], over={"edges": {"datatype": "FP32"}}),
            InvalidRequest,
            "INT64",
        ),
        (
            body([[1, 2, 3]], [[0, N]], over={"edges": {"data": [0.5, N]}}),
            InvalidRequest,
            "integer",
        ),
        (body([[1, 2, 3]], targets=(N + 1,)), InvalidRequest, r"out of range \[0, 11\)"),
        (body(targets=(N,)), InvalidRequest, r"out of range \[0, 10\)"),
    ],
)
def test_bad_new_vertex_inputs_are_clear_errors(doc, error, match):
    with pytest.raises(error, match=match):
        parse(doc)


def test_limits_are_413():
    with pytest.raises(PayloadTooLarge, match="at most 1"):
        parse(body([[1, 2, 3], [4, 5, 6]]), NewVertexLimits(max_vertices=1))
    with pytest.raises(PayloadTooLarge, match="at most 1 per request"):
        parse(body([[1, 2, 3]], [[0, N], [1, N]]), NewVertexLimits(max_edges=1))
    doc = body([[1, 2, 3]])
    doc["inputs"].append(dict(doc["inputs"][1]))
    with pytest.raises(InvalidRequest, match="given twice"):
        parse(doc)


def test_raw_bodies_json_and_binary_extension():
    from gnn_faas.gateway.inference_request import RawInferRequest

    doc = body([[1, 2, 3]], [[0, N]])
    raw = RawInferRequest(json.dumps(doc).encode())
    rest, added = split_new_vertex_inputs(raw)
    assert set(added) == {"features", "edges"} and [t["name"] for t in rest["inputs"]] == [
        "targets"
    ]
    # binary extension: targets as binary data after the JSON header; features as JSON
    targets = np.array([N], dtype="<i8").tobytes()
    doc["inputs"][0] = {"name": "targets", "datatype": "INT64", "shape": [1],
                        "parameters": {"binary_data_size": len(targets)}}  # fmt: skip
    header = json.dumps(doc).encode()
    rest, added = split_new_vertex_inputs(RawInferRequest(header + targets, len(header)))
    assert isinstance(rest, RawInferRequest) and rest.body.endswith(targets)
    kept = json.loads(rest.body[: int(rest.header_length)])
    assert [t["name"] for t in kept["inputs"]] == ["targets"] and set(added) == {
        "features",
        "edges",
    }
    req = parse_infer_request("m", rest, N + 1, max_targets=16)
    assert req.targets.tolist() == [N]
    doc["inputs"][1]["parameters"] = {"binary_data_size": 12}
    header = json.dumps(doc).encode()
    with pytest.raises(InvalidRequest, match="JSON 'data'"):
        split_new_vertex_inputs(RawInferRequest(header + targets, len(header)))


def test_bodies_without_new_vertices_are_not_parsed_twice():
    deep = b'{"inputs": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    assert split_new_vertex_inputs(deep) == (deep, {})  # left to the OIP parser's own check
    deep_nv = b'{"inputs": [{"name": "features"}], "x": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    assert split_new_vertex_inputs(deep_nv) == (deep_nv, {})

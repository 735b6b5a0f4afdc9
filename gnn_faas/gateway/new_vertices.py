"""New-vertex requests: vertices and edges carried by an OIP request.

Besides its kind's inputs (``targets``, ``pairs`` or ``vertices``) a request
may carry vertices that are not in the graph yet (OMEGA's and inductive
serving's setting) as two more inputs::

    {"name": "features", "datatype": "FP32",  "shape": [n, d], "data": [...]}
    {"name": "edges",    "datatype": "INT64", "shape": [m, 2], "data": [...]}

Id convention: on a graph of ``N`` stored vertices the new vertices are
``N .. N + n - 1`` (row ``i`` of ``features`` is vertex ``N + i``); the
targets, pairs, vertices and edge endpoints may name them. An edge ``[u, v]``
means ``v`` aggregates from ``u``; on a symmetrised graph it is added both
ways. ``d`` must be the graph's feature dimension. The added vertices and
edges belong to this request only: nothing is written to the store, and such
a request is executed as its own plan (its edges change the neighbourhoods of
the stored vertices they touch, so merging it with other requests would leak
them into their answers).

Checks (HTTP 400 unless noted): datatypes, shapes (``[n, d]``, ``[m, 2]``),
the dimension, finite values, endpoint ids in ``[0, N + n)``, no self-loops;
more than ``max_vertices`` new vertices or ``max_edges`` edges is 413.

This module only takes these two inputs out of the body and validates them;
the rest of the body goes to :func:`~gnn_faas.gateway.inference_request.parse_infer_request`
with ``num_nodes = N + n``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gnn_faas.errors import InvalidRequest, PayloadTooLarge
from gnn_faas.gateway.inference_request import RawInferRequest
from gnn_faas.storage.overlay import GraphOverlay

if TYPE_CHECKING:  # the map comes from the store; parsing needs only its methods
    from gnn_faas.storage.reorder import IdMap

NEW_VERTEX_INPUTS = ("features", "edges")
DEFAULT_MAX_VERTICES = 256
DEFAULT_MAX_EDGES = 65536


@dataclass(frozen=True)
class NewVertexLimits:
    max_vertices: int = DEFAULT_MAX_VERTICES
    max_edges: int = DEFAULT_MAX_EDGES


def split_new_vertex_inputs(body: Any) -> tuple[Any, dict[str, dict[str, Any]]]:
    """``(body without the new-vertex inputs, those inputs by name)``.

    ``body``: JSON text or bytes, a parsed object, or a
    :class:`~gnn_faas.gateway.inference_request.RawInferRequest` (with the
    binary extension the two inputs must carry JSON ``data``; the binary
    tensors of the other inputs are kept as they are). A body that is not a
    JSON object with an ``inputs`` list is returned as it is (the OIP parser
    reports what is wrong with it).
    """
    if isinstance(body, RawInferRequest):
        if body.header_length is None:
            rest, found = split_new_vertex_inputs(body.body)
            return (body if not found else rest), found
        try:
            n = int(body.header_length)
        except (TypeError, ValueError):
            return body, {}  # the OIP parser says what is wrong
        header, tail = body.body[:n], body.body[n:]
        rest, found = split_new_vertex_inputs(header)
        if not found:
            return body, {}
        for t in found.values():
            if "binary_data_size" in (t.get("parameters") or {}):
                raise InvalidRequest(
                    f"input {t['name']!r} must carry JSON 'data' (binary tensor data is "
                    "supported for the other inputs only)"
                )
        new_header = json.dumps(rest, allow_nan=False).encode()
        return RawInferRequest(new_header + tail, len(new_header)), found
    doc: Any = body
    if isinstance(body, (bytes, bytearray, memoryview, str)):
        raw = body.encode() if isinstance(body, str) else bytes(body)
        if b'"features"' not in raw and b'"edges"' not in raw:
            return body, {}  # the common case: no second JSON parse
        try:
            doc = json.loads(raw, parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return body, {}  # the OIP parser says what is wrong
    if not isinstance(doc, Mapping) or not isinstance(doc.get("inputs"), list):
        return body, {}
    found: dict[str, dict[str, Any]] = {}
    rest = []
    for t in doc["inputs"]:
        if isinstance(t, dict) and t.get("name") in NEW_VERTEX_INPUTS:
            if t["name"] in found:
                raise InvalidRequest(f"input {t['name']!r} is given twice")
            found[t["name"]] = t
        else:
            rest.append(t)
    if not found:
        return body, {}
    return {**doc, "inputs": rest}, found


def _shape(t: dict[str, Any], name: str) -> tuple[int, int]:
    shape = t.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        want = "[n, d]" if name == "features" else "[m, 2]"
        raise InvalidRequest(f"input {name!r} must have shape {want}, got {shape!r}")
    return int(shape[0]), int(shape[1])


def _array(t: dict[str, Any], name: str, shape: tuple[int, int], dtype) -> np.ndarray:
    if "data" not in t:
        raise InvalidRequest(f"input {name!r} has no 'data'")
    try:
        arr = np.array(t["data"], dtype=dtype)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise InvalidRequest(f"input {name!r}: 'data' must be a (nested) list of numbers") from None
    count = shape[0] * shape[1]
    if arr.size != count:
        raise InvalidRequest(
            f"input {name!r}: shape {list(shape)} needs {count} values, 'data' has {arr.size}"
        )
    return arr.reshape(shape)


def parse_new_vertices(
    inputs: Mapping[str, dict[str, Any]],
    num_nodes: int,
    feature_dim: int,
    symmetrized: bool,
    limits: NewVertexLimits | None = None,
    id_map: IdMap | None = None,
) -> GraphOverlay | None:
    """The request's :class:`GraphOverlay`, or ``None`` when it adds nothing.
    ``id_map``: a renumbered graph's map (stored vertices' ids in ``edges`` are
    the user's; new vertices' ids are the same in both numberings)."""
    if not inputs:
        return None
    limits = limits or NewVertexLimits()
    n = 0
    features = np.zeros((0, feature_dim), np.float32)
    if "features" in inputs:
        t = inputs["features"]
        if t.get("datatype") != "FP32":
            raise InvalidRequest(
                f"input 'features' has datatype {t.get('datatype')!r}; new vertices' "
                "features must be FP32"
            )
        n, d = _shape(t, "features")
        if n > limits.max_vertices:
            raise PayloadTooLarge(
                f"input 'features' adds {n} vertices; at most {limits.max_vertices} per request"
            )
        if d != feature_dim:
            raise InvalidRequest(
                f"input 'features' has dimension {d}; the graph's features have {feature_dim}"
            )
        with np.errstate(over="ignore"):  # beyond FP32's range: inf, refused below
            features = _array(t, "features", (n, d), np.float64).astype(np.float32)
        if not np.isfinite(features).all():
            raise InvalidRequest(
                "input 'features' must hold finite FP32 numbers (|x| <= 3.4028235e38)"
            )
    edges = np.zeros((0, 2), np.int64)
    if "edges" in inputs:
        t = inputs["edges"]
        if t.get("datatype") not in ("INT64", "INT32"):
            raise InvalidRequest(
                f"input 'edges' has datatype {t.get('datatype')!r}; edges must be INT64 or INT32"
            )
        m, cols = _shape(t, "edges")
        if cols != 2:
            raise InvalidRequest(f"input 'edges' must have shape [m, 2], got [{m}, {cols}]")
        if m > limits.max_edges:
            raise PayloadTooLarge(
                f"input 'edges' has {m} edges; at most {limits.max_edges} per request"
            )
        raw = _array(t, "edges", (m, 2), object)
        if m and set(map(type, raw.reshape(-1).tolist())) != {int}:
            raise InvalidRequest("input 'edges': 'data' must hold integer vertex ids")
        edges = raw.astype(np.int64) if m else edges
        total = num_nodes + n
        bad = (edges < 0) | (edges >= total)
        if bad.any():
            shown = ", ".join(str(v) for v in np.unique(edges[bad])[:5])
            raise InvalidRequest(
                f"input 'edges': endpoint id(s) out of range [0, {total}) "
                f"({num_nodes} stored + {n} new vertices): {shown}"
            )
        if (edges[:, 0] == edges[:, 1]).any():
            raise InvalidRequest("input 'edges' must not hold self-loops")
    if n == 0 and edges.shape[0] == 0:
        return None
    if id_map is not None:
        edges = id_map.to_stored(edges)
    return GraphOverlay.build(num_nodes, features, edges, symmetrize=symmetrized)


def new_vertex_metadata() -> list[dict[str, Any]]:
    """The optional inputs, for ``GET /v2/models/{m}`` metadata."""
    return [
        {"name": "features", "datatype": "FP32", "shape": [-1, -1], "optional": True},
        {"name": "edges", "datatype": "INT64", "shape": [-1, 2], "optional": True},
    ]


def new_vertex_parameters(num_nodes: int, limits: NewVertexLimits) -> dict[str, Any]:
    """What ``GET /v2/models/{m}`` says of new-vertex requests, in its
    ``parameters`` (the OIP ``inputs`` list the kinds' required inputs only)."""
    return {
        "new_vertex_inputs": new_vertex_metadata(),
        "new_vertex_ids_from": num_nodes,
        "max_new_vertices": limits.max_vertices,
        "max_new_edges": limits.max_edges,
    }


def _refuse_constant(token: str):
    raise ValueError(f"{token} is not JSON")  # the OIP parser then says so

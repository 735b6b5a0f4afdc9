"""Open Inference Protocol (KServe v2 REST) requests and responses.

A request body is ``{"id": str?, "inputs": [{"name", "shape", "datatype",
"data"}], "outputs": [{"name"}]?, "parameters": {...}?}``. The input names
choose the request kind, as in λGrapher's parser:

========  =====================================  ==================================
kind      inputs                                 answer
========  =====================================  ==================================
vertex    ``targets`` INT64/INT32 ``[n]``         one row per target
edge      ``pairs`` INT64/INT32 ``[k, 2]``        one score per pair
graph     ``vertices`` INT64/INT32 ``[n]`` and     one readout per graph id
          optional ``graph_ids`` ``[n]``
========  =====================================  ==================================

``data`` may be flat (row-major) or nested, as OIP allows. Every problem is an
:class:`~gnn_faas.errors.InvalidRequest` (HTTP 400) whose message names the
input and what is wrong; more vertex ids than ``max_targets`` is
:class:`~gnn_faas.errors.PayloadTooLarge` (413).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest, PayloadTooLarge

KINDS = ("vertex", "edge", "graph")
# Input names of each kind; the first is the one that identifies it.
KIND_INPUTS = {"vertex": ("targets",), "edge": ("pairs",), "graph": ("vertices", "graph_ids")}
ID_DATATYPES = ("INT64", "INT32")

_NUMPY_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}


@dataclass(frozen=True)
class InferenceRequest:
    """A parsed, validated inference request.

    ``targets``: the unique vertices whose embeddings the answer needs, sorted
    (int64); the k-hop vertex set is expanded from these. ``vertices``: the
    vertex ids in request order (vertex: the targets as sent; edge: the pairs
    flattened; graph: the vertices as sent). ``pairs``: ``[k, 2]`` for edge
    requests. ``graph_ids``: segment of each of ``vertices`` for graph requests
    (all 0 when not sent). ``output_names``: the outputs the client asked for
    (empty: the model's defaults).
    """

    id: str
    model: str
    kind: str
    targets: np.ndarray
    vertices: np.ndarray
    pairs: np.ndarray | None = None
    graph_ids: np.ndarray | None = None
    output_names: tuple[str, ...] = ()
    parameters: dict[str, Any] = field(default_factory=dict)
    id_from_client: bool = True

    @property
    def num_graphs(self) -> int:
        """Number of readouts of a graph request (max graph id + 1)."""
        if self.graph_ids is None or self.graph_ids.size == 0:
            return 0
        return int(self.graph_ids.max()) + 1


def parse_infer_request(
    model: str, body: bytes | str | Mapping[str, Any], num_nodes: int, max_targets: int
) -> InferenceRequest:
    """Parse and validate an OIP ``/v2/models/{model}/infer`` body.

    ``num_nodes``: vertex ids must lie in ``[0, num_nodes)``. ``max_targets``:
    the most vertex ids a request may name (``n`` targets, ``2k`` for ``k``
    pairs, ``n`` vertices), since the work grows with them.
    """
    doc = _load_body(body)
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise InvalidRequest(f"'id' must be a string, got {type(req_id).__name__}")
    parameters = doc.get("parameters", {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be a JSON object")
    output_names = _output_names(doc.get("outputs"))
    inputs = _inputs_by_name(doc.get("inputs"))

    kinds = [k for k in KINDS if KIND_INPUTS[k][0] in inputs]
    if not kinds:
        raise InvalidRequest(
            f"no recognised input: send 'targets' (vertex), 'pairs' (edge) or 'vertices' "
            f"(graph); got {sorted(inputs)}"
        )
    if len(kinds) > 1:
        names = [KIND_INPUTS[k][0] for k in kinds]
        raise InvalidRequest(f"inputs {names} mix request kinds: send exactly one of them")
    kind = kinds[0]
    unknown = sorted(set(inputs) - set(KIND_INPUTS[kind]))
    if unknown:
        raise InvalidRequest(
            f"unexpected input(s) {unknown} for a {kind}-level request "
            f"(expected {list(KIND_INPUTS[kind])})"
        )

    pairs = graph_ids = None
    if kind == "vertex":
        vertices = _id_tensor(inputs["targets"], 1, max_targets, num_nodes)
    elif kind == "edge":
        pairs = _id_tensor(inputs["pairs"], 2, max_targets, num_nodes, cols=2)
        vertices = pairs.reshape(-1)
    else:
        vertices = _id_tensor(inputs["vertices"], 1, max_targets, num_nodes)
        if "graph_ids" in inputs:
            graph_ids = _int_tensor(inputs["graph_ids"], 1, max_targets)
            if graph_ids.shape != vertices.shape:
                raise InvalidRequest(
                    f"input 'graph_ids' has shape {list(graph_ids.shape)} but 'vertices' has "
                    f"{list(vertices.shape)}: give one graph id per vertex"
                )
            if graph_ids.min() < 0:
                raise InvalidRequest("input 'graph_ids' must be >= 0")
            # Graph ids name segments 0..G-1 and each must have a vertex, so a
            # readout is never the empty set.
            present = np.unique(graph_ids)
            if present.size != int(present[-1]) + 1:
                missing = np.setdiff1d(np.arange(present[-1] + 1), present)[:5].tolist()
                raise InvalidRequest(
                    f"input 'graph_ids' must use every id from 0 to its maximum; "
                    f"no vertex has graph id(s) {missing}"
                )
        else:
            graph_ids = np.zeros(vertices.shape, np.int64)
    return InferenceRequest(
        id=req_id if req_id is not None else uuid.uuid4().hex,
        model=model,
        kind=kind,
        targets=np.unique(vertices),
        vertices=vertices,
        pairs=pairs,
        graph_ids=graph_ids,
        output_names=output_names,
        parameters=parameters,
        id_from_client=req_id is not None,
    )


def make_infer_response(
    model: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray] | Sequence[tuple[str, np.ndarray]],
    model_version: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An OIP response body: ``{"model_name", "id", "outputs": [{"name",
    "shape", "datatype", "data"}]}`` with ``data`` flattened row-major."""
    items = outputs.items() if isinstance(outputs, Mapping) else outputs
    out = []
    for name, value in items:
        arr = np.asarray(value)
        dtype = _NUMPY_DATATYPES.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"output {name!r}: no OIP datatype for numpy dtype {arr.dtype}")
        out.append(
            {
                "name": name,
                "shape": [int(s) for s in arr.shape],
                "datatype": dtype,
                "data": arr.reshape(-1).tolist(),
            }
        )
    resp: dict[str, Any] = {"model_name": model}
    if model_version is not None:
        resp["model_version"] = model_version
    if request_id is not None:
        resp["id"] = request_id
    if parameters:
        resp["parameters"] = dict(parameters)
    resp["outputs"] = out
    return resp


# -- helpers ---------------------------------------------------------------------


def _load_body(body: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest("malformed JSON: the body is not UTF-8") from None
    if isinstance(body, str):
        if not body.strip():
            raise InvalidRequest("malformed JSON: the body is empty")
        try:
            body = json.loads(body)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(
                f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
            ) from None
    if not isinstance(body, Mapping):
        raise InvalidRequest(f"the request body must be a JSON object, not {_json_type(body)}")
    return body


def _output_names(outputs: Any) -> tuple[str, ...]:
    if outputs is None:
        return ()
    if not isinstance(outputs, list):
        raise InvalidRequest("'outputs' must be a list of {\"name\": ...} objects")
    names = []
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidRequest(f"outputs[{i}] must be an object with a string 'name'")
        names.append(o["name"])
    return tuple(names)


def _inputs_by_name(inputs: Any) -> dict[str, dict[str, Any]]:
    if inputs is None:
        raise InvalidRequest("missing 'inputs': an OIP request needs a list of input tensors")
    if not isinstance(inputs, list):
        raise InvalidRequest(f"'inputs' must be a list, not {_json_type(inputs)}")
    if not inputs:
        raise InvalidRequest("'inputs' is empty: send at least one input tensor")
    by_name: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise InvalidRequest(f"inputs[{i}] must be an object, not {_json_type(t)}")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"inputs[{i}] has no 'name'")
        for key in ("shape", "datatype", "data"):
            if key not in t:
                raise InvalidRequest(f"input {name!r} has no {key!r}")
        if name in by_name:
            raise InvalidRequest(f"input {name!r} is given twice")
        by_name[name] = t
    return by_name


def _shape(t: dict[str, Any]) -> tuple[int, ...]:
    shape = t["shape"]
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
    ):
        raise InvalidRequest(
            f"input {t['name']!r}: 'shape' must be a non-empty list of non-negative integers, "
            f"got {shape!r}"
        )
    return tuple(shape)


def _flatten(data: Any, name: str) -> list[Any]:
    """Row-major flattening of OIP ``data`` (flat or nested lists)."""
    if not isinstance(data, list):
        raise InvalidRequest(f"input {name!r}: 'data' must be a list, not {_json_type(data)}")
    if not any(isinstance(x, list) for x in data):
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            flat.append(x)
        else:
            stack.pop()
    return flat


def _int_tensor(t: dict[str, Any], ndim: int, max_ids: int, cols: int | None = None) -> np.ndarray:
    """An integer input tensor as int64 with its declared shape."""
    name = t["name"]
    datatype = t["datatype"]
    if datatype not in ID_DATATYPES:
        raise InvalidRequest(
            f"input {name!r} has datatype {datatype!r}; vertex ids must be "
            f"{' or '.join(ID_DATATYPES)}"
        )
    shape = _shape(t)
    if len(shape) != ndim or (cols is not None and shape[-1] != cols):
        want = "[n]" if ndim == 1 else f"[k, {cols}]"
        raise InvalidRequest(f"input {name!r} must have shape {want}, got {list(shape)}")
    count = int(np.prod(shape))
    if count == 0:
        raise InvalidRequest(f"input {name!r} is empty: send at least one vertex id")
    if count > max_ids:
        raise PayloadTooLarge(
            f"input {name!r} names {count} vertex ids; at most {max_ids} are allowed per request"
        )
    flat = _flatten(t["data"], name)
    if len(flat) != count:
        raise InvalidRequest(
            f"input {name!r}: shape {list(shape)} needs {count} values, 'data' has {len(flat)}"
        )
    # Exact type check (set of types, in C): bool is an int subclass that numpy
    # would silently take as 0/1, and 1.0 must not pass as a vertex id.
    if set(map(type, flat)) != {int}:
        bad = next(x for x in flat if type(x) is not int)
        raise InvalidRequest(f"input {name!r}: 'data' must hold integers, found {bad!r}")
    lo, hi = (-(2**31), 2**31 - 1) if datatype == "INT32" else (-(2**63), 2**63 - 1)
    if min(flat) < lo or max(flat) > hi:
        raise InvalidRequest(f"input {name!r}: a value does not fit {datatype}")
    return np.asarray(flat, dtype=np.int64).reshape(shape)


def _id_tensor(
    t: dict[str, Any], ndim: int, max_ids: int, num_nodes: int, cols: int | None = None
) -> np.ndarray:
    ids = _int_tensor(t, ndim, max_ids, cols)
    bad = (ids < 0) | (ids >= num_nodes)
    if bad.any():
        values = np.unique(ids[bad])
        shown = ", ".join(str(v) for v in values[:5]) + (", ..." if values.size > 5 else "")
        raise InvalidRequest(
            f"input {t['name']!r}: vertex id(s) out of range [0, {num_nodes}): {shown}"
        )
    return ids


def _json_type(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, (int, float)):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, list):
        return "a list"
    return "an object"

"""Open Inference Protocol (KServe v2 REST) requests and responses.

A request body is ``{"id": str?, "inputs": [{"name", "shape", "datatype",
"data" | "parameters": {"binary_data_size"}}], "outputs": [{"name",
"parameters": {"binary_data"}?}]?, "parameters": {"binary_data_output"}?}``.
The input names choose the request kind, as in λGrapher's parser; the table
:data:`REQUEST_KINDS` is the one declarative place that says which inputs
(names, datatypes, shapes, roles) each kind takes and which outputs it answers:

========  =====================================  ==================================
kind      inputs                                 outputs
========  =====================================  ==================================
vertex    ``targets`` INT64/INT32 ``[n]``         ``scores`` ``[n, c]`` and
                                                 ``predictions`` ``[n]`` (a vertex
                                                 task), else ``embeddings`` ``[n, d]``
edge      ``pairs`` INT64/INT32 ``[k, 2]``        ``scores`` ``[k]``
graph     ``vertices`` INT64/INT32 ``[n]`` and     ``readout`` ``[g, d]``, one row per
          optional ``graph_ids`` ``[n]``           graph id ``0..g-1``
========  =====================================  ==================================

A model answers the kinds its task allows (:data:`TASK_KINDS`): a
vertex-classification model answers vertex requests only.

``data`` may be flat (row-major) or nested exactly as the shape says. With the
binary tensor data extension (Triton/KServe) the JSON object is the first
``Inference-Header-Content-Length`` bytes of the body, and each input whose
``parameters.binary_data_size`` is set has its raw little-endian bytes after it,
in input order. Outputs are answered in binary when the request asks
(``outputs[i].parameters.binary_data`` or ``parameters.binary_data_output``).

Every check runs before work starts, in time and memory proportional to the
request's size (limits: :class:`~gnn_faas.config.LimitsConfig`): a problem is
an :class:`~gnn_faas.errors.InvalidRequest` (HTTP 400) whose message names the
field and what is wrong; more vertex ids than ``max_targets`` is
:class:`~gnn_faas.errors.PayloadTooLarge` (413); a kind or output the model
does not have is :class:`~gnn_faas.errors.UnsupportedRequest` (400).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np

from gnn_faas.config import LimitsConfig
from gnn_faas.errors import GnnFaasError, InvalidRequest, PayloadTooLarge, UnsupportedRequest

if TYPE_CHECKING:  # the map comes from the store; parsing needs only its methods
    from gnn_faas.storage.reorder import IdMap

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_MIME = "application/octet-stream"
ID_DATATYPES = ("INT64", "INT32")

# OIP datatype -> little-endian numpy dtype (BYTES has no fixed size: unsupported)
DATATYPES = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_NUMPY_DATATYPES = {dt.name: name for name, dt in DATATYPES.items()}


@dataclass(frozen=True)
class InputSpec:
    """One input a request kind takes. ``shape``: ``-1`` for any length, a
    number for a fixed dimension. ``role``: ``vertex_ids`` (each in ``[0,
    num_nodes)``, counted against ``max_targets``), ``graph_ids`` (one per
    vertex, naming graphs ``0..g-1``) or ``values`` (numbers, e.g. FP32
    features, at most ``LimitsConfig.max_values`` elements). A new input is one
    row in :data:`REQUEST_KINDS`; what it means is up to the data plane."""

    name: str
    datatypes: tuple[str, ...]
    shape: tuple[int, ...]
    role: str
    required: bool = True

    def shape_text(self) -> str:
        free = "n" if len(self.shape) == 1 else "k"
        return "[" + ", ".join(free if d < 0 else str(d) for d in self.shape) + "]"


@dataclass(frozen=True)
class OutputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: per request; 0: the model's output width


@dataclass(frozen=True)
class RequestKind:
    """A request kind: its inputs (the first one identifies it) and outputs
    (per model task: vertex requests to a class-score model get scores and
    predictions, to an embedding model the embeddings)."""

    name: str
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    outputs_for_vertex_task: tuple[OutputSpec, ...] | None = None

    def output_specs(self, task: str) -> tuple[OutputSpec, ...]:
        if task == "vertex" and self.outputs_for_vertex_task is not None:
            return self.outputs_for_vertex_task
        return self.outputs


REQUEST_KINDS: dict[str, RequestKind] = {
    k.name: k
    for k in (
        RequestKind(
            "vertex",
            (InputSpec("targets", ID_DATATYPES, (-1,), "vertex_ids"),),
            (OutputSpec("embeddings", "FP32", (-1, 0)),),
            (OutputSpec("scores", "FP32", (-1, 0)), OutputSpec("predictions", "INT64", (-1,))),
        ),
        RequestKind(
            "edge",
            (InputSpec("pairs", ID_DATATYPES, (-1, 2), "vertex_ids"),),
            (OutputSpec("scores", "FP32", (-1,)),),
        ),
        RequestKind(
            "graph",
            (
                InputSpec("vertices", ID_DATATYPES, (-1,), "vertex_ids"),
                InputSpec("graph_ids", ID_DATATYPES, (-1,), "graph_ids", required=False),
            ),
            (OutputSpec("readout", "FP32", (-1, 0)),),
        ),
    )
}
KINDS = tuple(REQUEST_KINDS)
# Input names of each kind; the first is the one that identifies it.
KIND_INPUTS = {k: tuple(i.name for i in rk.inputs) for k, rk in REQUEST_KINDS.items()}
# The request kinds a model answers, by its task (ModelConfig.task): class scores
# of a vertex task mean nothing to the edge or graph heads.
TASK_KINDS = {
    "vertex": ("vertex",),
    "embedding": ("vertex", "edge", "graph"),
    "edge": ("vertex", "edge"),
    "graph": ("vertex", "graph"),
}


def model_signature(task: str, out_dim: int) -> dict[str, list[dict[str, Any]]]:
    """The ``inputs`` and ``outputs`` of a model's OIP metadata for its task."""
    inputs, outputs, seen = [], [], set()
    for kind in TASK_KINDS.get(task, tuple(REQUEST_KINDS)):
        rk = REQUEST_KINDS[kind]
        for i in rk.inputs:
            if i.name not in seen:
                seen.add(i.name)
                inputs.append({"name": i.name, "datatype": i.datatypes[0], "shape": list(i.shape)})
        for o in rk.output_specs(task):
            if o.name not in seen:
                seen.add(o.name)
                shape = [out_dim if d == 0 else d for d in o.shape]
                outputs.append({"name": o.name, "datatype": o.datatype, "shape": shape})
    return {"inputs": inputs, "outputs": outputs}


@dataclass(frozen=True)
class RawInferRequest:
    """An HTTP infer body as received: ``header_length`` is the value of the
    ``Inference-Header-Content-Length`` header (None: the body is all JSON)."""

    body: bytes
    header_length: str | int | None = None


@dataclass(frozen=True)
class InferenceRequest:
    """A parsed, validated inference request.

    ``targets``: the unique vertices whose embeddings the answer needs, sorted
    (int64); the k-hop vertex set is expanded from these. ``vertices``: the
    vertex ids in request order (vertex: the targets as sent; edge: the pairs
    flattened; graph: the vertices as sent). ``pairs``: ``[k, 2]`` for edge
    requests. ``graph_ids``: segment of each of ``vertices`` for graph requests
    (all 0 when not sent). ``output_names``: the outputs the client asked for
    (empty: all of the kind's outputs). ``binary_outputs``: the outputs to send
    as binary tensor data. ``tensors``: every parsed input by name.
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
    binary_outputs: frozenset[str] = frozenset()
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_graphs(self) -> int:
        """Number of readouts of a graph request (max graph id + 1)."""
        if self.graph_ids is None or self.graph_ids.size == 0:
            return 0
        return int(self.graph_ids.max()) + 1

    def select_outputs(self, outputs: Mapping[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        """The outputs the client asked for, in its order (all when it named none)."""
        if not self.output_names:
            return list(outputs.items())
        return [(n, outputs[n]) for n in self.output_names]


def parse_infer_request(
    model: str,
    body: bytes | str | Mapping[str, Any] | RawInferRequest,
    num_nodes: int,
    max_targets: int,
    *,
    task: str | None = None,
    limits: LimitsConfig | None = None,
    id_map: IdMap | None = None,
) -> InferenceRequest:
    """Parse and validate an OIP ``/v2/models/{model}/infer`` body.

    ``num_nodes``: vertex ids must lie in ``[0, num_nodes)``. ``max_targets``:
    the most vertex ids a request may name (``n`` targets, ``2k`` for ``k``
    pairs, ``n`` vertices), since the work grows with them. ``task``: the
    model's task (None: any kind is answered). ``limits``: the configured bounds.
    ``id_map``: a renumbered graph's map; ``vertices``, ``pairs`` and
    ``targets`` are then stored ids (``tensors`` keep the ids as sent).
    """
    limits = limits or LimitsConfig()
    doc, blob = _load_body(body, limits)
    req_id = _request_id(doc, limits)
    parameters = _parameters(doc.get("parameters"), "'parameters'", limits)
    outputs = _outputs(doc.get("outputs"), limits)
    inputs = _inputs_by_name(doc.get("inputs"), limits)
    kind = _request_kind(inputs, model, task)
    binary = _binary_outputs(outputs, parameters, kind, model, task)
    tensors = _read_inputs(inputs, blob, kind, num_nodes, max_targets, limits)
    vertices, pairs, graph_ids = _vertices_of(kind, tensors, id_map)
    return InferenceRequest(
        id=req_id if req_id is not None else uuid.uuid4().hex,
        model=model,
        kind=kind,
        targets=np.unique(vertices),
        vertices=vertices,
        pairs=pairs,
        graph_ids=graph_ids,
        output_names=tuple(outputs),
        parameters=parameters,
        id_from_client=req_id is not None,
        binary_outputs=binary,
        tensors=tensors,
    )


def load_json(body: bytes | str, limits: LimitsConfig) -> Mapping[str, Any]:
    """A body's JSON object, with the inference request's limits and messages."""
    return _load_body(body, limits)[0]


def read_tensors(
    body: bytes | str | Mapping[str, Any] | RawInferRequest,
    specs: tuple[InputSpec, ...],
    limits: LimitsConfig,
) -> dict[str, np.ndarray]:
    """The named tensors of an OIP-shaped body (``{"inputs": [...]}``, JSON data or
    the binary tensor extension), each checked against its spec; an input no
    spec names is a 400. Other endpoints' tensors (graph updates) reuse the
    inference request's parsing and bounds."""
    doc, blob = _load_body(body, limits)
    inputs = _inputs_by_name(doc.get("inputs"), limits)
    known = {s.name: s for s in specs}
    unknown = sorted(set(inputs) - set(known))
    if unknown:
        raise InvalidRequest(f"unexpected input(s) {unknown[:8]}; known: {sorted(known)}")
    blobs = _split_binary(inputs, blob)
    return {
        name: _read_tensor(t, known[name], limits.max_values, blobs.get(name))
        for name, t in inputs.items()
    }


def _request_id(doc: Mapping[str, Any], limits: LimitsConfig) -> str | None:
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise InvalidRequest(f"'id' must be a string, got {_json_type(req_id)}")
    if req_id is not None and len(req_id) > limits.max_id_chars:
        raise InvalidRequest(f"'id' is longer than {limits.max_id_chars} characters")
    return req_id


def _request_kind(inputs: Mapping[str, Any], model: str, task: str | None) -> str:
    """The request's kind, named by its first input (read from the table at
    each call); its other inputs must be that kind's, and the model's task
    must answer it."""
    kinds = [k for k, rk in REQUEST_KINDS.items() if rk.inputs[0].name in inputs]
    if not kinds:
        firsts = ", ".join(f"{rk.inputs[0].name!r} ({k})" for k, rk in REQUEST_KINDS.items())
        raise InvalidRequest(f"no recognised input: send {firsts}; got {sorted(inputs)[:8]}")
    if len(kinds) > 1:
        names = [REQUEST_KINDS[k].inputs[0].name for k in kinds]
        raise InvalidRequest(f"inputs {names} mix request kinds: send exactly one of them")
    kind = kinds[0]
    expected = [i.name for i in REQUEST_KINDS[kind].inputs]
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        raise InvalidRequest(
            f"unexpected input(s) {unknown[:8]} for a {kind}-level request (expected {expected})"
        )
    if task is not None and kind not in TASK_KINDS.get(task, tuple(REQUEST_KINDS)):
        raise UnsupportedRequest(
            f"model {model!r} (task {task!r}) does not answer {kind}-level requests; "
            f"it answers {', '.join(TASK_KINDS[task])}-level requests"
        )
    return kind


def _binary_outputs(
    outputs: Mapping[str, bool | None],
    parameters: Mapping[str, Any],
    kind: str,
    model: str,
    task: str | None,
) -> frozenset[str]:
    """The outputs to answer as binary data: each requested output must be one
    the kind has; ``binary_data_output`` applies to every output whose own
    ``binary_data`` is unset."""
    known_outputs = [o.name for o in REQUEST_KINDS[kind].output_specs(task or "vertex")]
    for name in outputs:
        if name not in known_outputs:
            raise UnsupportedRequest(
                f"unknown output {name[:64]!r} for a {kind}-level request to model {model!r}; "
                f"outputs: {known_outputs}"
            )
    binary_all = _flag(parameters, "binary_data_output", "'parameters'")
    wanted = outputs or dict.fromkeys(known_outputs)
    return frozenset(n for n, b in wanted.items() if (binary_all if b is None else b))


def _read_inputs(
    inputs: Mapping[str, Any],
    blob: memoryview,
    kind: str,
    num_nodes: int,
    max_targets: int,
    limits: LimitsConfig,
) -> dict[str, np.ndarray]:
    """The kind's input tensors. Sizes first (shapes and byte counts, before
    any data is read), then values; vertex ids are summed over inputs against
    ``max_targets`` (the work grows with them) and checked against the graph."""
    blobs = _split_binary(inputs, blob)
    tensors: dict[str, np.ndarray] = {}
    total = 0
    for s in REQUEST_KINDS[kind].inputs:
        if s.name not in inputs:
            if s.required:
                raise InvalidRequest(f"a {kind}-level request needs input {s.name!r}")
            continue
        cap = limits.max_values if s.role == "values" else max_targets
        tensors[s.name] = arr = _read_tensor(inputs[s.name], s, cap, blobs.get(s.name))
        if s.role == "vertex_ids":
            total += arr.size
            if total > max_targets:
                raise PayloadTooLarge(
                    f"the request names {total} vertex ids; at most {max_targets} are allowed"
                )
            _check_ids(arr, s.name, num_nodes)
    return tensors


def _vertices_of(
    kind: str, tensors: Mapping[str, np.ndarray], id_map: IdMap | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(vertices, pairs, graph_ids)`` of a request, as stored ids when the
    graph is renumbered (``id_map``)."""
    pairs = graph_ids = None
    if kind == "vertex":
        vertices = tensors["targets"]
    elif kind == "edge":
        pairs = tensors["pairs"]
        vertices = pairs.reshape(-1)
    else:
        vertices = tensors["vertices"]
        if "graph_ids" in tensors:
            graph_ids = _check_graph_ids(tensors["graph_ids"], vertices)
        else:
            graph_ids = np.zeros(vertices.shape, np.int64)
    if id_map is not None:
        vertices = id_map.to_stored(vertices)
        if pairs is not None:
            pairs = vertices.reshape(pairs.shape)
    return vertices, pairs, graph_ids


# -- responses --------------------------------------------------------------------


def _not_json(token: str):
    """``json.loads`` takes ``NaN`` and ``Infinity``; JSON (RFC 8259) does not."""
    raise InvalidRequest(f"malformed JSON: {token} is not a JSON number")


class NonFiniteResult(GnnFaasError):
    """A result holding NaN or infinity: answered 500 and logged, never sent."""

    http_status = 500


@dataclass
class InferResponse:
    """An OIP response: outputs (name, array) in order, those in ``binary``
    sent as binary tensor data after the JSON header."""

    model: str
    request_id: str | None
    outputs: list[tuple[str, np.ndarray]]
    parameters: dict[str, Any] = field(default_factory=dict)
    binary: frozenset[str] = frozenset()
    model_version: str | None = None

    def header(self) -> dict[str, Any]:
        """The JSON part: binary outputs carry ``parameters.binary_data_size``
        instead of ``data``."""
        out = []
        for name, value in self.outputs:
            arr = np.asarray(value)
            dtype = _NUMPY_DATATYPES.get(arr.dtype.name)
            if dtype is None:
                raise TypeError(f"output {name!r}: no OIP datatype for numpy dtype {arr.dtype}")
            entry: dict[str, Any] = {
                "name": name,
                "shape": [int(s) for s in arr.shape],
                "datatype": dtype,
            }
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                # never emitted (NaN/Infinity are not JSON): a fault of ours, logged as 500
                bad = int(arr.size - np.isfinite(arr).sum())
                raise NonFiniteResult(
                    f"output {name!r} of model {self.model!r} holds {bad} non-finite "
                    f"value(s) of {arr.size} (overflow in the model's arithmetic)"
                )
            if name in self.binary:
                entry["parameters"] = {"binary_data_size": int(arr.nbytes)}
            else:
                entry["data"] = arr.reshape(-1).tolist()
            out.append(entry)
        resp: dict[str, Any] = {"model_name": self.model}
        if self.model_version is not None:
            resp["model_version"] = self.model_version
        if self.request_id is not None:
            resp["id"] = self.request_id
        if self.parameters:
            resp["parameters"] = dict(self.parameters)
        resp["outputs"] = out
        return resp

    def encode(self) -> tuple[bytes, dict[str, str]]:
        """HTTP body and headers: plain JSON, or with binary outputs the JSON
        header, its length in ``Inference-Header-Content-Length`` and the raw
        little-endian bytes of each binary output in order."""
        head = json.dumps(self.header(), separators=(",", ":"), allow_nan=False).encode()
        if not self.binary:
            return head, {"Content-Type": "application/json"}
        blobs = [
            np.ascontiguousarray(v, dtype=np.asarray(v).dtype.newbyteorder("<")).tobytes()
            for n, v in self.outputs
            if n in self.binary
        ]
        headers = {"Content-Type": BINARY_MIME, HEADER_LENGTH: str(len(head))}
        return b"".join([head, *blobs]), headers


def make_infer_response(
    model: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray] | Sequence[tuple[str, np.ndarray]],
    model_version: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An OIP JSON response body: ``{"model_name", "id", "outputs": [{"name",
    "shape", "datatype", "data"}]}`` with ``data`` flattened row-major."""
    items = outputs.items() if isinstance(outputs, Mapping) else outputs
    return InferResponse(
        model, request_id, list(items), dict(parameters or {}), model_version=model_version
    ).header()


def decode_infer_response(body: bytes, header_length: str | int | None = None) -> dict:
    """A response body back into JSON with numpy ``data`` (binary outputs read
    from after the header): what a client does, for tests and tools."""
    doc, blob = _load_body(RawInferRequest(body, header_length), LimitsConfig(max_json_depth=64))
    offset = 0
    for o in doc.get("outputs", []):
        size = (o.get("parameters") or {}).get("binary_data_size")
        dt = DATATYPES[o["datatype"]]
        if size is None:
            o["data"] = np.asarray(o["data"], dtype=dt).reshape(o["shape"])
        else:
            o["data"] = np.frombuffer(blob[offset : offset + size], dtype=dt).reshape(o["shape"])
            offset += size
    return doc


# -- helpers ---------------------------------------------------------------------


def _load_body(
    body: bytes | str | Mapping[str, Any] | RawInferRequest, limits: LimitsConfig
) -> tuple[Mapping[str, Any], memoryview]:
    """The JSON object of a body and the binary tensor data after it."""
    blob = memoryview(b"")
    if isinstance(body, RawInferRequest):
        raw, length = body.body, body.header_length
        if len(raw) > limits.max_body_bytes:  # JSON and binary data together
            raise PayloadTooLarge(f"request body exceeds {limits.max_body_bytes} bytes")
        if length is not None:
            n = _header_length(length, len(raw))
            blob = memoryview(raw)[n:]
            raw = raw[:n]
        body = raw
    if isinstance(body, (bytes, bytearray, memoryview)):
        if len(body) > limits.max_body_bytes:
            raise PayloadTooLarge(f"request body exceeds {limits.max_body_bytes} bytes")
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(
                "malformed JSON: the body is not UTF-8 (binary tensor data needs the "
                f"{HEADER_LENGTH} header)"
            ) from None
    if isinstance(body, str):
        if not body.strip():
            raise InvalidRequest("malformed JSON: the body is empty")
        try:
            body = json.loads(body, parse_constant=_not_json)
        except json.JSONDecodeError as exc:
            hint = ""
            if exc.msg == "Extra data":
                hint = f" (binary tensor data after the JSON needs the {HEADER_LENGTH} header)"
            raise InvalidRequest(
                f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}){hint}"
            ) from None
        except RecursionError:
            raise InvalidRequest(
                f"malformed JSON: nested deeper than {limits.max_json_depth} levels"
            ) from None
        except ValueError as exc:  # e.g. an integer beyond Python's digit limit
            raise InvalidRequest(f"malformed JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(body, Mapping):
        raise InvalidRequest(f"the request body must be a JSON object, not {_json_type(body)}")
    _check_depth(body, limits.max_json_depth)
    return body, blob


def _header_length(value: str | int, body_len: int) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"{HEADER_LENGTH} must be an integer, got {value!r}") from None
    if not 0 < n <= body_len:
        raise InvalidRequest(
            f"{HEADER_LENGTH} is {n}, but the body has {body_len} bytes: the JSON header "
            "must be a non-empty prefix of the body"
        )
    return n


def _check_depth(doc: Any, max_depth: int) -> None:
    """Nesting of arrays and objects at most ``max_depth`` (iterative: a deep
    body cannot exhaust the stack); time in proportion to the containers."""
    level = [doc]
    depth = 1
    while level:
        if depth > max_depth:
            raise InvalidRequest(f"malformed JSON: nested deeper than {max_depth} levels")
        nxt = []
        for c in level:
            items = c.values() if isinstance(c, dict) else c
            nxt.extend(x for x in items if isinstance(x, (list, dict)))
        level = nxt
        depth += 1


def _parameters(p: Any, where: str, limits: LimitsConfig) -> dict[str, Any]:
    """An OIP parameters object: string keys, scalar values (string, number, bool)."""
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise InvalidRequest(f"{where} must be a JSON object, not {_json_type(p)}")
    if len(p) > limits.max_parameters:
        raise InvalidRequest(f"{where} has more than {limits.max_parameters} entries")
    for k, v in p.items():
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise InvalidRequest(f"{where}[{k!r}] must be a string, number or boolean")
    return dict(p)


def _flag(p: Mapping[str, Any], key: str, where: str, default: bool | None = False) -> bool | None:
    v = p.get(key, default)
    if v is not default and not isinstance(v, bool):
        raise InvalidRequest(f"{where}[{key!r}] must be true or false, got {str(v)[:40]!r}")
    return v


def _outputs(outputs: Any, limits: LimitsConfig) -> dict[str, bool | None]:
    """Requested outputs: name -> whether it goes back as binary data (None:
    not said, the request's ``binary_data_output`` decides)."""
    if outputs is None:
        return {}
    if not isinstance(outputs, list):
        raise InvalidRequest("'outputs' must be a list of {\"name\": ...} objects")
    if len(outputs) > limits.max_outputs:
        raise InvalidRequest(f"'outputs' has more than {limits.max_outputs} entries")
    names: dict[str, bool | None] = {}
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidRequest(f"outputs[{i}] must be an object with a string 'name'")
        name = o["name"]
        if name in names:
            raise InvalidRequest(f"output {name[: limits.max_id_chars]!r} is requested twice")
        params = _parameters(o.get("parameters"), f"outputs[{i}].parameters", limits)
        names[name] = _flag(params, "binary_data", f"outputs[{i}].parameters", None)
    return names


def _inputs_by_name(inputs: Any, limits: LimitsConfig) -> dict[str, dict[str, Any]]:
    if inputs is None:
        raise InvalidRequest("missing 'inputs': an OIP request needs a list of input tensors")
    if not isinstance(inputs, list):
        raise InvalidRequest(f"'inputs' must be a list, not {_json_type(inputs)}")
    if not inputs:
        raise InvalidRequest("'inputs' is empty: send at least one input tensor")
    if len(inputs) > limits.max_inputs:
        raise InvalidRequest(f"'inputs' has more than {limits.max_inputs} entries")
    by_name: dict[str, dict[str, Any]] = {}
    for i, t in enumerate(inputs):
        if not isinstance(t, dict):
            raise InvalidRequest(f"inputs[{i}] must be an object, not {_json_type(t)}")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"inputs[{i}] has no 'name'")
        if len(name) > limits.max_id_chars:
            raise InvalidRequest(f"inputs[{i}]: the name is longer than {limits.max_id_chars}")
        params = _parameters(t.get("parameters"), f"input {name!r} parameters", limits)
        for key in ("shape", "datatype"):
            if key not in t:
                raise InvalidRequest(f"input {name!r} has no {key!r}")
        if not isinstance(t["datatype"], str):
            raise InvalidRequest(f"input {name!r}: 'datatype' must be a string")
        if not isinstance(t["shape"], list) or len(t["shape"]) > limits.max_rank:
            raise InvalidRequest(
                f"input {name!r}: 'shape' must be a list of at most {limits.max_rank} integers"
            )
        size = params.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidRequest(
                    f"input {name!r}: binary_data_size must be a non-negative integer"
                )
            if "data" in t:
                raise InvalidRequest(f"input {name!r} has both 'data' and binary_data_size")
        elif "data" not in t:
            raise InvalidRequest(f"input {name!r} has no 'data' (nor binary_data_size)")
        if name in by_name:
            raise InvalidRequest(f"input {name!r} is given twice")
        by_name[name] = {**t, "parameters": params}
    return by_name


def _split_binary(inputs: dict[str, dict[str, Any]], blob: memoryview) -> dict[str, memoryview]:
    """Each binary input's bytes, in input order; the sizes must add up to the
    binary part of the body exactly."""
    out: dict[str, memoryview] = {}
    offset = 0
    for name, t in inputs.items():
        size = t["parameters"].get("binary_data_size")
        if size is None:
            continue
        if offset + size > len(blob):
            raise InvalidRequest(
                f"input {name!r}: binary_data_size {size} runs past the end of the body "
                f"({len(blob) - offset} binary bytes left)"
            )
        out[name] = blob[offset : offset + size]
        offset += size
    if offset != len(blob):
        raise InvalidRequest(
            f"the body has {len(blob) - offset} bytes after the JSON header and the binary "
            f"inputs' binary_data_size ({HEADER_LENGTH} or the sizes are wrong)"
        )
    return out


def _shape(t: dict[str, Any], spec: InputSpec) -> tuple[int, ...]:
    shape = t["shape"]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise InvalidRequest(
            f"input {spec.name!r}: 'shape' must be a list of non-negative integers, "
            f"got {str(shape)[:100]}"
        )
    if len(shape) != len(spec.shape) or any(w >= 0 and s != w for s, w in zip(shape, spec.shape)):
        raise InvalidRequest(
            f"input {spec.name!r} must have shape {spec.shape_text()}, got {str(shape)[:100]}"
        )
    return tuple(shape)


def _flatten(data: Any, shape: tuple[int, ...], name: str) -> list[Any]:
    """Row-major flattening of OIP ``data``: flat, or nested exactly as ``shape``
    says (ragged or partly nested data is an error). One pass per dimension."""
    if not isinstance(data, list):
        raise InvalidRequest(f"input {name!r}: 'data' must be a list, not {_json_type(data)}")
    if not any(isinstance(x, list) for x in data):
        return data
    level: list[Any] = [data]
    for d, n in enumerate(shape):
        if any(type(x) is not list or len(x) != n for x in level):
            raise InvalidRequest(
                f"input {name!r}: nested 'data' does not match shape {list(shape)} "
                f"(dimension {d} must be lists of {n})"
            )
        level = list(chain.from_iterable(level))
    if any(type(x) is list for x in level):
        raise InvalidRequest(
            f"input {name!r}: nested 'data' is deeper than shape {list(shape)} "
            "(ragged or extra nesting)"
        )
    return level


def _read_tensor(
    t: dict[str, Any], spec: InputSpec, max_elements: int, blob: memoryview | None
) -> np.ndarray:
    """An input tensor with its declared shape: integer datatypes as int64,
    floating ones as their own width (finite values only). The element count
    comes from the shape and is bounded before ``data`` is read."""
    name = spec.name
    datatype = t["datatype"]
    if datatype not in spec.datatypes:
        raise InvalidRequest(
            f"input {name!r} has datatype {datatype[:16]!r}; it must be "
            f"{' or '.join(spec.datatypes)}"
        )
    shape = _shape(t, spec)
    count = math.prod(shape)  # exact (Python ints): a huge shape cannot wrap around
    if count == 0:
        raise InvalidRequest(f"input {name!r} is empty: send at least one value")
    if count > max_elements:
        # a product of huge dimensions may be too long to print as a decimal
        shown = count if count < 10**18 else "over 10^18"
        what = "ids" if spec.role != "values" else "values"
        raise PayloadTooLarge(
            f"input {name!r} names {shown} {what}; at most {max_elements} are allowed per request"
        )
    dtype = DATATYPES[datatype]
    floating = dtype.kind == "f"
    if blob is not None:
        if len(blob) != count * dtype.itemsize:
            raise InvalidRequest(
                f"input {name!r}: shape {list(shape)} of {datatype} needs "
                f"{count * dtype.itemsize} bytes, binary_data_size is {len(blob)}"
            )
        arr = np.frombuffer(blob, dtype=dtype).reshape(shape)
        if floating:
            return _finite(arr.astype(dtype.newbyteorder("=")), name)
        return arr.astype(np.int64)
    flat = _flatten(t["data"], shape, name)
    if len(flat) != count:
        raise InvalidRequest(
            f"input {name!r}: shape {list(shape)} needs {count} values, 'data' has {len(flat)}"
        )
    # Exact type check (set of types, in C): bool is an int subclass that numpy
    # would silently take as 0/1, and 1.0 must not pass as a vertex id.
    allowed = {int, float} if floating else {int}
    if not set(map(type, flat)) <= allowed:
        bad = next(x for x in flat if type(x) not in allowed)
        kind = "numbers" if floating else "integers"
        raise InvalidRequest(f"input {name!r}: 'data' must hold {kind}, found {bad!r:.40}")
    if floating:
        with np.errstate(over="ignore"):  # beyond the width: inf, refused below
            return _finite(np.asarray(flat, dtype=dtype.newbyteorder("=")).reshape(shape), name)
    info = np.iinfo(dtype)
    if min(flat) < info.min or max(flat) > info.max:
        raise InvalidRequest(f"input {name!r}: a value does not fit {datatype}")
    return np.asarray(flat, dtype=np.int64).reshape(shape)


def _finite(arr: np.ndarray, name: str) -> np.ndarray:
    if not np.isfinite(arr).all():
        raise InvalidRequest(f"input {name!r}: values must be finite (no NaN or infinity)")
    return arr


def _check_ids(ids: np.ndarray, name: str, num_nodes: int) -> None:
    bad = (ids < 0) | (ids >= num_nodes)
    if bad.any():
        values = np.unique(ids[bad])
        shown = ", ".join(str(v) for v in values[:5]) + (", ..." if values.size > 5 else "")
        raise InvalidRequest(f"input {name!r}: vertex id(s) out of range [0, {num_nodes}): {shown}")


def _check_graph_ids(graph_ids: np.ndarray, vertices: np.ndarray) -> np.ndarray:
    """Graph ids name readouts ``0..g-1`` and each needs a vertex, so ``g`` is at
    most the number of vertices: larger ids are rejected before anything is sized
    by them (the readout is ``[g, d]``)."""
    if graph_ids.shape != vertices.shape:
        raise InvalidRequest(
            f"input 'graph_ids' has shape {list(graph_ids.shape)} but 'vertices' has "
            f"{list(vertices.shape)}: give one graph id per vertex"
        )
    n = vertices.size
    if graph_ids.min() < 0:
        raise InvalidRequest("input 'graph_ids' must be >= 0")
    if graph_ids.max() >= n:
        raise InvalidRequest(
            f"input 'graph_ids': {n} vertices make at most {n} graphs, so graph ids must lie "
            f"in [0, {n}); got {int(graph_ids.max())}"
        )
    present = np.unique(graph_ids)
    if present.size != int(present[-1]) + 1:
        # the first missing ids, from the gaps of the sorted ids (no arange to the max)
        ids = np.concatenate(([-1], present))
        gaps = np.flatnonzero(np.diff(ids) > 1)[:5]
        missing = [int(ids[g]) + 1 for g in gaps]
        raise InvalidRequest(
            f"input 'graph_ids' must use every id from 0 to its maximum; "
            f"no vertex has graph id(s) {missing}"
        )
    return graph_ids


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

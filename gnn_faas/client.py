"""A Python client for a gnn-faas gateway (Open Inference Protocol, KServe v2 REST).

:class:`GatewayClient` sends one inference request of each kind the gateway
serves (docs/serving.md): vertex (``targets [n]``), edge (``pairs [k, 2]``) and
graph-level (``vertices [n]`` with optional ``graph_ids [n]``), each optionally
with new vertices (``features [n_new, d]`` FP32 and ``edges [m, 2]``, ids from
``N`` = the stored vertex count up), as JSON or as Triton's binary tensor data
both ways. Answers come back as numpy arrays in an :class:`InferResult`.

Errors keep the gateway's meaning: 400 (and any other 4xx) is
:class:`~gnn_faas.errors.InvalidRequest`, 404 :class:`~gnn_faas.errors.NotFound`,
413 :class:`~gnn_faas.errors.PayloadTooLarge`,
503 (overload, shedding, no instance) and an unreachable gateway
:class:`~gnn_faas.errors.Unavailable` with ``retry_after_s`` from ``Retry-After``:
worth retrying, never a bad request. Every message is the gateway's ``error``.

The request builders (:func:`vertex_request`, :func:`edge_request`,
:func:`graph_request`, :func:`new_vertex_request`) return the JSON body as a
dict; the replay and the benchmarks' open-loop senders send them as they are.

Example::

    from gnn_faas import GatewayClient

    with GatewayClient("http://127.0.0.1:8080") as gw:
        result = gw.infer_vertices("bitcoin-otc", [1, 2, 3])
        print(result.outputs["predictions"], result.parameters["latency_ms"])
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import requests

from gnn_faas.errors import (
    GnnFaasError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)

DEFAULT_URL = "http://127.0.0.1:8080"
HEADER_LENGTH = "Inference-Header-Content-Length"
NEW_VERTEX_INPUTS = ("features", "edges")
# OIP datatype <-> little-endian numpy dtype (what the gateway answers with)
DATATYPES = {
    "BOOL": np.dtype("?"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_STATUS_ERRORS: dict[int, type[GnnFaasError]] = {
    400: InvalidRequest,
    404: NotFound,
    413: PayloadTooLarge,
    503: Unavailable,
}


@dataclass(frozen=True)
class InferResult:
    """One answer: ``outputs`` by name as numpy arrays of their declared shape,
    the gateway's ``parameters`` (``latency_ms``, ``breakdown_ms``, sharing,
    ...), the model's name and the request id it answered."""

    model: str
    id: str | None
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)


def tensor(name: str, values: Any, datatype: str | None = None) -> dict[str, Any]:
    """One OIP input ``{"name", "datatype", "shape", "data"}`` from array-like
    ``values``: integers as INT64, floating point as FP32 unless ``datatype`` says."""
    arr = np.asarray(values)
    if datatype is None:
        datatype = "FP32" if arr.dtype.kind == "f" else "INT64"
    arr = arr.astype(DATATYPES[datatype], copy=False)
    return {
        "name": name,
        "datatype": datatype,
        "shape": [int(s) for s in arr.shape],
        "data": arr.reshape(-1).tolist(),
    }


def _body(inputs: list[dict], request_id: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": inputs}
    if request_id is not None:
        body["id"] = request_id
    return body


def vertex_request(targets: Any, request_id: str | None = None) -> dict[str, Any]:
    """The JSON body of a vertex request for vertex ids ``targets`` ``[n]``."""
    return _body([tensor("targets", np.atleast_1d(np.asarray(targets, np.int64)))], request_id)


def edge_request(pairs: Any, request_id: str | None = None) -> dict[str, Any]:
    """The JSON body of an edge request for vertex pairs ``pairs`` ``[k, 2]``."""
    return _body([tensor("pairs", np.asarray(pairs, np.int64).reshape(-1, 2))], request_id)


def graph_request(
    vertices: Any, graph_ids: Any = None, request_id: str | None = None
) -> dict[str, Any]:
    """The JSON body of a graph-level request: ``vertices`` ``[n]`` and, for
    several graphs, ``graph_ids`` ``[n]`` naming graphs ``0..g-1``."""
    inputs = [tensor("vertices", np.atleast_1d(np.asarray(vertices, np.int64)))]
    if graph_ids is not None:
        inputs.append(tensor("graph_ids", np.atleast_1d(np.asarray(graph_ids, np.int64))))
    return _body(inputs, request_id)


def with_new_vertices(body: dict[str, Any], features: Any, edges: Any) -> dict[str, Any]:
    """``body`` plus new vertices: ``features`` ``[n_new, d]`` (FP32, row ``i`` is
    vertex ``N + i``) and ``edges`` ``[m, 2]`` (``[u, v]``: ``v`` aggregates from ``u``)."""
    return {
        **body,
        "inputs": [
            *body["inputs"],
            tensor("features", np.asarray(features, np.float32)),
            tensor("edges", np.asarray(edges, np.int64).reshape(-1, 2)),
        ],
    }


def new_vertex_request(
    targets: Any, features: Any, edges: Any, request_id: str | None = None
) -> dict[str, Any]:
    """A vertex request that adds vertices and edges for itself only (nothing
    is written to the store)."""
    return with_new_vertices(vertex_request(targets, request_id), features, edges)


def encode(body: Mapping[str, Any], binary: bool = False) -> tuple[bytes, dict[str, str]]:
    """HTTP body and headers of a request. ``binary``: each input's ``data`` goes
    as raw little-endian bytes after the JSON header (Triton's binary tensor
    data extension), and every output is asked for in binary too; new vertices'
    ``features`` and ``edges`` keep JSON ``data`` (the gateway reads them so)."""
    if not binary:
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    inputs, blobs = [], []
    for entry in body["inputs"]:
        if entry["name"] in NEW_VERTEX_INPUTS:
            inputs.append(entry)
            continue
        arr = np.asarray(entry["data"], DATATYPES[entry["datatype"]])
        blob = arr.tobytes()
        meta = {k: v for k, v in entry.items() if k != "data"}
        meta["parameters"] = {**entry.get("parameters", {}), "binary_data_size": len(blob)}
        inputs.append(meta)
        blobs.append(blob)
    params = {**body.get("parameters", {}), "binary_data_output": True}
    head = json.dumps({**body, "inputs": inputs, "parameters": params}).encode()
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
    return b"".join([head, *blobs]), headers


def decode(content: bytes, header_length: str | None) -> InferResult:
    """An answer's body (JSON, or JSON then binary outputs) as an :class:`InferResult`."""
    n = len(content) if header_length is None else int(header_length)
    doc = json.loads(content[:n])
    offset, outputs = n, {}
    for o in doc.get("outputs", []):
        dtype = DATATYPES[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            arr = np.asarray(o["data"], dtype)
        else:
            arr = np.frombuffer(content, dtype, int(size) // dtype.itemsize, offset)
            offset += int(size)
        outputs[o["name"]] = arr.reshape(o["shape"])
    return InferResult(doc.get("model_name", ""), doc.get("id"), outputs, doc.get("parameters", {}))


def error_for(status: int, message: str, retry_after: str | None = None) -> GnnFaasError:
    """The exception for a non-200 answer: 503 -> :class:`Unavailable`, 404 ->
    :class:`NotFound`, 413 -> :class:`PayloadTooLarge`, other 4xx ->
    :class:`InvalidRequest`, else :class:`GnnFaasError`; ``http_status`` is ``status``."""
    cls = _STATUS_ERRORS.get(status) or (InvalidRequest if 400 <= status < 500 else GnnFaasError)
    exc = cls(f"HTTP {status}: {message}")
    exc.http_status = status
    if isinstance(exc, Unavailable) and retry_after:
        with contextlib.suppress(ValueError):  # an HTTP date: keep the default
            exc.retry_after_s = float(retry_after)
    return exc


class GatewayClient:
    """A gnn-faas gateway at ``url``, over one kept-alive ``requests`` session.

    Args:
        url: the gateway's base URL, e.g. ``http://127.0.0.1:8080``.
        timeout_s: seconds one HTTP call may take (connect and read).
        session: a ``requests.Session`` to reuse (default: a new one, closed by
            :meth:`close` or the ``with`` block).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout_s: float = 30.0,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self._own = session is None
        self.session = session or requests.Session()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the session (only one this client made)."""
        if self._own:
            self.session.close()

    # -- inference -----------------------------------------------------------

    def infer(
        self,
        model: str,
        body: Mapping[str, Any],
        *,
        outputs: Sequence[str] | None = None,
        binary: bool = False,
    ) -> InferResult:
        """Send one inference request body (any kind; see the builders above).

        Args:
            model: the model's name (``GET /v2/models`` lists them).
            body: the request's JSON body, e.g. :func:`vertex_request`'s.
            outputs: the outputs to answer (default: all of the kind's).
            binary: send the inputs and ask for the outputs as binary tensor data.

        Returns:
            The answer's outputs (numpy arrays) and parameters.

        Raises:
            Unavailable: 503 or the gateway unreachable (retry after ``retry_after_s``).
            NotFound: 404 (an unknown model).
            InvalidRequest: any other 4xx (``PayloadTooLarge`` for 413).
            GnnFaasError: a 5xx other than 503.
        """
        if outputs is not None:
            body = {**body, "outputs": [{"name": n} for n in outputs]}
        data, headers = encode(body, binary)
        r = self._call("POST", f"/v2/models/{model}/infer", data=data, headers=headers)
        return decode(r.content, r.headers.get(HEADER_LENGTH))

    def infer_vertices(
        self,
        model: str,
        targets: Any,
        *,
        features: Any = None,
        edges: Any = None,
        **kwargs: Any,
    ) -> InferResult:
        """A vertex request: scores and predictions (a vertex task) or embeddings.

        Args:
            model: the model's name.
            targets: vertex ids ``[n]``.
            features: new vertices' features ``[n_new, d]`` (with ``edges``), or None.
            edges: new edges ``[m, 2]`` over stored and new ids, or None.
            **kwargs: ``outputs`` and ``binary`` as in :meth:`infer`.

        Returns:
            ``outputs["scores"]`` ``[n, c]`` and ``outputs["predictions"]`` ``[n]``,
            or ``outputs["embeddings"]`` ``[n, d]``.
        """
        body = vertex_request(targets)
        if features is not None or edges is not None:
            body = with_new_vertices(body, features, edges if edges is not None else [])
        return self.infer(model, body, **kwargs)

    def infer_edges(self, model: str, pairs: Any, **kwargs: Any) -> InferResult:
        """An edge request.

        Args:
            model: the model's name (an edge or embedding task).
            pairs: vertex pairs ``[k, 2]``.
            **kwargs: ``outputs`` and ``binary`` as in :meth:`infer`.

        Returns:
            ``outputs["scores"]`` ``[k]``.
        """
        return self.infer(model, edge_request(pairs), **kwargs)

    def infer_graphs(
        self, model: str, vertices: Any, graph_ids: Any = None, **kwargs: Any
    ) -> InferResult:
        """A graph-level request (readout over each graph's vertices).

        Args:
            model: the model's name (a graph or embedding task).
            vertices: vertex ids ``[n]``.
            graph_ids: per vertex its graph ``0..g-1`` ``[n]`` (None: one graph).
            **kwargs: ``outputs`` and ``binary`` as in :meth:`infer`.

        Returns:
            ``outputs["readout"]`` ``[g, d]``, one row per graph id.
        """
        return self.infer(model, graph_request(vertices, graph_ids), **kwargs)

    # -- metadata and status -------------------------------------------------

    def models(self) -> list[str]:
        """Returns: the names of the models the gateway serves."""
        return [m["name"] for m in self._call("GET", "/v2/models").json()["models"]]

    def metadata(self, model: str) -> dict[str, Any]:
        """Returns: a model's OIP metadata (inputs, outputs, ``parameters`` such as
        ``new_vertex_ids_from``)."""
        return self._call("GET", f"/v2/models/{model}").json()

    def ready(self) -> bool:
        """Returns: whether the gateway answers ``/v2/health/ready`` with 200."""
        try:
            self._call("GET", "/v2/health/ready")
        except GnnFaasError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        """Returns: ``/v1/status``: instances, pools and queues, buffers, caches,
        metering (``gnn-faas status`` prints it)."""
        return self._call("GET", "/v1/status").json()

    def _call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            r = self.session.request(method, self.url + path, timeout=self.timeout_s, **kwargs)
        except requests.RequestException as exc:
            raise Unavailable(f"gateway at {self.url} unreachable ({type(exc).__name__})") from None
        if r.status_code != 200:
            try:
                doc = r.json()
            except ValueError:
                doc = None
            message = doc["error"] if isinstance(doc, dict) and "error" in doc else r.text[:200]
            raise error_for(r.status_code, message, r.headers.get("Retry-After"))
        return r

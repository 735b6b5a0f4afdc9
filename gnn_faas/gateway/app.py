"""The gateway's HTTP endpoints: thin Flask views over the :class:`DataPlane`.

Open Inference Protocol (KServe/Triton v2 REST)::

    GET  /v2/health/live          the process is up
    GET  /v2/health/ready         every model could serve a request now (also /_/health)
    GET  /v2                      server metadata
    GET  /v2/models               the served models (a convenience beyond OIP)
    GET  /v2/models/{m}           model metadata
    GET  /v2/models/{m}/ready     that model could serve a request now
    POST /v2/models/{m}/infer     inference (JSON, or the binary tensor data extension)
    GET  /v2/graphs[/{g}]         the served graphs: version, counts, log size, last compaction
    POST /v2/graphs/{g}/updates   a batch of graph changes (bearer token), one new version
    GET  /v2/models/{m}/versions/{v}[/ready], POST .../versions/{v}/infer
                                  the same for a version the model's metadata lists
                                  (404 + JSON for another; the answer names the version)
    GET  /v2/openapi.json         OpenAPI 3 description of these endpoints
    GET  /metrics                 Prometheus text format
    GET  /v1/status               instances, queues, buffers, caches, metering (JSON)

Errors are ``{"error": "..."}``: 4xx for the client's fault, 503 with
``Retry-After`` for overload, 500 (logged with its traceback) only for a fault
of ours. The mapping from exception to status is :func:`gnn_faas.errors.http_status`;
the handlers are installed by :func:`gnn_faas.http.install`, which also gives every
answer its request id (W3C ``traceparent``, continued from the client's).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

from flask import Flask, Response, jsonify, request

from gnn_faas import __version__
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.buffered_worker import front_stats
from gnn_faas.gateway.data_plane import DataPlane, ModelRuntime
from gnn_faas.gateway.inference_request import HEADER_LENGTH, RawInferRequest
from gnn_faas.gateway.openapi import build_openapi
from gnn_faas.http import body_route, install, loop_route, request_body
from gnn_faas.metrics import CONTENT_TYPE, http_families

log = logging.getLogger("gnn_faas.gateway")

# POST /v2/models/{m}[/versions/{v}]/infer, as the dispatcher matches it (Flask's
# default converter: one path segment each)
INFER_PATH = r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer"
UPDATES_PATH = r"/v2/graphs/(?P<graph>[^/]+)/updates"


def create_gateway_app(plane: DataPlane) -> Flask:
    app = Flask("gnn_faas.gateway")
    install(app, plane.serving.limits.max_body_bytes)
    app.extensions["gnn_faas_plane"] = plane
    timer = app.extensions["gnn_faas_timer"]
    plane.metrics.add_collector(lambda: http_families(timer))

    # answered on the server's event loop: liveness never waits for a thread
    loop_route(app, "/v2/health/live", lambda: (200, {"live": plane.live()}))

    @app.get("/_/health")  # OpenFaaS's default readiness probe path
    @app.get("/v2/health/ready")
    def ready():
        ok = plane.ready()
        return jsonify({"ready": ok}), 200 if ok else 503

    @app.get("/v2")
    def server_metadata():
        return jsonify(
            {
                "name": "gnn-faas",
                "version": __version__,
                "extensions": ["binary_tensor_data", "metrics", "openapi"],
            }
        )

    @app.get("/v2/openapi.json")
    def openapi():
        return jsonify(
            build_openapi(sorted(plane.models), plane.serving.limits, sorted(plane.graphs))
        )

    @app.get("/v2/models")
    def models():
        return jsonify({"models": [rt.metadata() for rt in plane.models.values()]})

    def runtime(name: str, version: str | None) -> ModelRuntime:
        """The model, checked to serve ``version`` when one is named (404 otherwise)."""
        rt = plane.model(name)
        if version is not None:
            versions = rt.metadata()["versions"]
            if version not in versions:
                raise NotFound(
                    f"model {name!r} has no version {version!r}; versions: {', '.join(versions)}"
                )
        return rt

    @app.get("/v2/models/<name>")
    @app.get("/v2/models/<name>/versions/<version>")
    def model_metadata(name: str, version: str | None = None):
        return jsonify(runtime(name, version).metadata())

    @app.get("/v2/models/<name>/ready")
    @app.get("/v2/models/<name>/versions/<version>/ready")
    def model_ready(name: str, version: str | None = None):
        ok = runtime(name, version).ready()
        return jsonify({"name": name, "ready": ok}), 200 if ok else 503

    add_infer_routes(app, runtime)
    add_graph_routes(app, plane)

    @app.get("/metrics")
    def metrics():
        return Response(plane.metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/v1/status")
    def status():
        window = {}
        for key in ("window_start", "window_end"):
            if key in request.args:
                try:
                    value = float(request.args[key])
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise InvalidRequest(f"{key} must be a finite number (monotonic seconds)")
                window[key] = value
        doc = plane.status(window.get("window_start"), window.get("window_end"))
        doc["front"] = front_stats()  # the HTTP front: refused, timed out, framing errors
        return jsonify(doc)

    @app.after_request
    def log_request(resp):
        log.debug("%s %s %s", request.method, request.path, resp.status_code)
        return resp

    return app


def add_graph_routes(app: Flask, plane: DataPlane) -> None:
    """``GET /v2/graphs``, ``GET /v2/graphs/{g}`` and ``POST /v2/graphs/{g}/updates``
    (gateway/graph_service.py; a bearer token for writes)."""

    @app.get("/v2/graphs")
    def graphs():
        return jsonify({"graphs": plane.updates.list()})

    @app.get("/v2/graphs/<graph>")
    def graph_info(graph: str):
        return jsonify(plane.updates.info(graph))

    def updates_from_bytes(params: dict, body: bytes, headers) -> tuple[bytes, dict]:
        # a writer's batches skip Flask too: its work per batch is taken from serving
        raw = RawInferRequest(body, headers.get(HEADER_LENGTH.lower()))
        answer = plane.updates.update(params["graph"], raw, headers.get("authorization"))
        return json.dumps(answer).encode(), {"Content-Type": "application/json"}

    @app.post("/v2/graphs/<graph>/updates")
    def graph_updates(graph: str):  # what the dispatcher leaves: chunked bodies
        headers = {k.lower(): v for k, v in request.headers.items()}
        body, out = updates_from_bytes({"graph": graph}, request_body(), headers)
        return Response(body, status=200, headers=out)

    body_route(app, UPDATES_PATH, updates_from_bytes)


def add_infer_routes(app: Flask, runtime) -> None:
    """``POST /v2/models/{m}[/versions/{v}]/infer``: a Flask view, and the same
    answered by the :class:`~gnn_faas.http.FrameDispatcher` without Flask
    (``gnn_faas/http.py``); ``runtime(name, version)`` is the model (404 for
    an unknown one or version)."""

    def answer_infer(name: str, version: str | None, raw: RawInferRequest):
        """The answer's body and headers (one code path for both routes)."""
        result = runtime(name, version).infer(raw)
        if version is not None:
            result = dataclasses.replace(result, model_version=version)
        return result.encode()

    @app.post("/v2/models/<name>/infer")
    @app.post("/v2/models/<name>/versions/<version>/infer")
    def infer(name: str, version: str | None = None):
        raw = RawInferRequest(request_body(), request.headers.get(HEADER_LENGTH))
        body, headers = answer_infer(name, version, raw)
        return Response(body, status=200, headers=headers)

    def infer_from_bytes(params: dict, body: bytes, headers) -> tuple[bytes, dict]:
        raw = RawInferRequest(body, headers.get(HEADER_LENGTH.lower()))
        return answer_infer(params["name"], params["version"], raw)

    body_route(app, INFER_PATH, infer_from_bytes)

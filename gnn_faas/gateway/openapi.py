"""The OpenAPI 3 description of the gateway's endpoints (``GET /v2/openapi.json``).

Built from the same tables the parser uses (request kinds, datatypes, limits),
so the description cannot drift from what the gateway accepts. The infer body
follows the Open Inference Protocol (KServe v2 / Triton) REST schema, JSON or
with the binary tensor data extension (``application/octet-stream``: the JSON
object, its length in the ``Inference-Header-Content-Length`` header, then raw
little-endian tensor bytes). What a schema cannot say (vertex ids below the
graph's ``num_nodes``, the element count a shape implies, graph ids naming
``0..g-1``) is checked by the parser and answered with 4xx.
"""

from __future__ import annotations

from typing import Any

from gnn_faas import __version__
from gnn_faas.config import LimitsConfig
from gnn_faas.gateway.inference_request import DATATYPES, HEADER_LENGTH, REQUEST_KINDS

OPENAPI_VERSION = "3.0.3"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "invalid request (the message names the field)",
        401: "a write without 'Authorization: Bearer TOKEN' (WWW-Authenticate: Bearer)",
        403: "a token that does not open this graph, or a graph no token opens",
        404: "unknown model (or model version) or graph",
        413: "request beyond a configured limit",
        503: "overloaded or no instance available; retry after Retry-After seconds",
    }
    out = {str(c): _json(_ref("Error"), text[c]) for c in codes}
    if 503 in codes:
        out["503"]["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}
    return out


def _schemas(limits: LimitsConfig) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "maxProperties": limits.max_parameters,
        "additionalProperties": {
            "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]
        },
    }
    names = sorted({i.name for k in REQUEST_KINDS.values() for i in k.inputs})
    outputs = sorted(
        {
            o.name
            for k in REQUEST_KINDS.values()
            for t in ("vertex", "embedding")
            for o in k.output_specs(t)
        }
    )
    nested = {"type": "array", "items": {}}  # flat or nested as the shape says
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Parameters": parameters,
        "RequestInput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string", "enum": names},
                "shape": {
                    "type": "array",
                    "maxItems": limits.max_rank,
                    "items": {"type": "integer", "minimum": 0},
                },
                "datatype": {"type": "string", "enum": sorted(DATATYPES)},
                "parameters": {
                    **parameters,
                    "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
                },
                "data": nested,
            },
            "description": "ids in 'data' (flat row-major or nested as 'shape'), or "
            "parameters.binary_data_size bytes of binary tensor data after the JSON",
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "enum": outputs},
                "parameters": {
                    **parameters,
                    "properties": {"binary_data": {"type": "boolean"}},
                },
            },
        },
        "InferenceRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string", "maxLength": limits.max_id_chars},
                "parameters": {
                    **parameters,
                    "properties": {"binary_data_output": {"type": "boolean"}},
                },
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": limits.max_inputs,
                    "items": _ref("RequestInput"),
                },
                "outputs": {
                    "type": "array",
                    "maxItems": limits.max_outputs,
                    "items": _ref("RequestOutput"),
                },
            },
        },
        "ResponseOutput": {
            "type": "object",
            "required": ["name", "shape", "datatype"],
            "properties": {
                "name": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "datatype": {"type": "string", "enum": sorted(DATATYPES)},
                "parameters": {"type": "object"},
                "data": {"type": "array"},
            },
        },
        "InferenceResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": {"type": "object"},
                "outputs": {"type": "array", "items": _ref("ResponseOutput")},
            },
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("TensorMetadata")},
                "outputs": {"type": "array", "items": _ref("TensorMetadata")},
                "parameters": {"type": "object"},
            },
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
    }


def _graph_paths(graphs: list[str]) -> dict[str, Any]:
    """``/v2/graphs``, ``/v2/graphs/{graph}`` and ``/v2/graphs/{graph}/updates``."""
    graph = {
        "name": "graph",
        "in": "path",
        "required": True,
        "description": "a served graph",
        "schema": {"type": "string", "enum": list(graphs)} if graphs else {"type": "string"},
    }
    edges = {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                       "minItems": 2, "maxItems": 2}}  # fmt: skip
    ids = {"type": "array", "items": {"type": "integer"}}
    rows = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    batch = {
        "type": "object",
        "additionalProperties": False,
        "description": "every field optional; (u, v): v aggregates from u",
        "properties": {
            "add_edges": edges,
            "remove_edges": edges,
            "remove_vertices": ids,
            "add_vertices": {
                "type": "object",
                "required": ["features"],
                "properties": {"features": rows, "labels": ids, "ids": ids},
            },
            "set_features": {
                "type": "object",
                "required": ["ids", "features"],
                "properties": {"ids": ids, "features": rows},
            },
        },
    }
    info = {"type": "object", "required": ["graph", "version", "num_nodes", "num_edges"]}
    return {
        "/v2/graphs": {
            "get": {
                "summary": "the served graphs: version, counts, log size, last compaction",
                "responses": {"200": _json({"type": "object"}, "graphs")},
            }
        },
        "/v2/graphs/{graph}": {
            "get": {
                "summary": "a graph's version, counts, log size and last compaction",
                "parameters": [graph],
                "responses": {"200": _json(info, "graph state"), **_errors(404)},
            }
        },
        "/v2/graphs/{graph}/updates": {
            "post": {
                "summary": "commit a batch of graph changes as one version (bearer token)",
                "parameters": [graph],
                "security": [{"bearer": []}],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": batch},
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                    },  # fmt: skip
                },
                "responses": {
                    "200": _json(info, "the version holding the batch, once durable"),
                    **_errors(400, 401, 403, 404, 413, 503),
                },
            }
        },
    }


def build_openapi(
    models: list[str], limits: LimitsConfig | None = None, graphs: list[str] | None = None
) -> dict[str, Any]:
    """The OpenAPI 3 document for a gateway serving ``models`` on ``graphs``."""
    limits = limits or LimitsConfig()
    model = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "a served model",
        "schema": {"type": "string", "enum": list(models)} if models else {"type": "string"},
    }
    ready = {
        "type": "object",
        "required": ["ready"],
        "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
    }
    binary_body = {
        "type": "string",
        "format": "binary",
        "description": f"the JSON InferenceRequest, its byte length in {HEADER_LENGTH}, "
        "then each binary input's raw little-endian bytes in input order",
    }
    paths = {
        "/v2/health/live": {
            "get": {
                "summary": "the server is live",
                "responses": {
                    "200": _json(
                        {"type": "object", "properties": {"live": {"type": "boolean"}}}, "live"
                    )
                },
            }
        },
        "/v2/health/ready": {
            "get": {
                "summary": "every model could serve a request now",
                "responses": {"200": _json(ready, "ready"), "503": _json(ready, "not ready")},
            }
        },
        "/_/health": {
            "get": {
                "summary": "readiness on OpenFaaS's default probe path (same as /v2/health/ready)",
                "responses": {"200": _json(ready, "ready"), "503": _json(ready, "not ready")},
            }
        },
        "/v2": {
            "get": {
                "summary": "server metadata",
                "responses": {"200": _json(_ref("ServerMetadata"), "server metadata")},
            }
        },
        "/v2/models": {
            "get": {
                "summary": "the served models (beyond OIP)",
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "models": {"type": "array", "items": _ref("ModelMetadata")}
                            },
                        },
                        "models",
                    )
                },
            }
        },
        "/v2/models/{name}": {
            "parameters": [model],
            "get": {
                "summary": "model metadata",
                "responses": {"200": _json(_ref("ModelMetadata"), "metadata"), **_errors(404)},
            },
        },
        "/v2/models/{name}/ready": {
            "parameters": [model],
            "get": {
                "summary": "the model could serve a request now",
                "responses": {
                    "200": _json(ready, "ready"),
                    "503": _json(ready, "not ready"),
                    **_errors(404),
                },
            },
        },
        "/v2/models/{name}/infer": {
            "parameters": [model],
            "post": {
                "summary": "inference (Open Inference Protocol)",
                "parameters": [
                    {
                        "name": HEADER_LENGTH,
                        "in": "header",
                        "required": False,
                        "description": "bytes of JSON at the start of a binary body",
                        "schema": {"type": "integer", "minimum": 0},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": _ref("InferenceRequest")},
                        "application/octet-stream": {"schema": binary_body},
                    },
                },
                "responses": {
                    "200": {
                        "description": "the outputs (binary ones after the JSON header)",
                        "content": {
                            "application/json": {"schema": _ref("InferenceResponse")},
                            "application/octet-stream": {"schema": binary_body},
                        },
                    },
                    **_errors(400, 404, 413, 503),
                },
            },
        },
        "/v2/openapi.json": {
            "get": {
                "summary": "this document",
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3 document")},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (gnn_faas_*)",
                "responses": {
                    "200": {
                        "description": "Prometheus text format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/v1/status": {
            "get": {
                "summary": "instances, queues, buffers, caches, metering",
                "parameters": [
                    {
                        "name": key,
                        "in": "query",
                        "required": False,
                        "description": "metering window bound (monotonic seconds)",
                        "schema": {"type": "number"},
                    }
                    for key in ("window_start", "window_end")
                ],
                "responses": {"200": _json({"type": "object"}, "status"), **_errors(400)},
            }
        },
    }
    version = {
        "name": "version",
        "in": "path",
        "required": True,
        "description": "a version the model's metadata lists ('1'); another is 404",
        "schema": {"type": "string"},
    }
    paths.update(_graph_paths(graphs or []))
    for suffix in ("", "/ready", "/infer"):  # OIP's versioned routes: the same operations
        item = paths[f"/v2/models/{{name}}{suffix}"]
        paths[f"/v2/models/{{name}}/versions/{{version}}{suffix}"] = {
            **item,
            "parameters": [model, version],
        }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "gnn-faas gateway",
            "version": __version__,
            "description": "Open Inference Protocol (KServe v2 REST) for GNN inference "
            "with the binary tensor data extension.",
        },
        "paths": paths,
        "components": {
            "schemas": _schemas(limits),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }

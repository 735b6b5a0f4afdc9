"""``POST /v2/graphs/{graph}/updates``: a batch of graph changes, committed as one version.

Two body forms, as inference has:

- JSON: ``{"add_edges": [[u, v], ...], "remove_edges": [[u, v], ...],
  "add_vertices": {"features": [[...]], "labels": [...], "ids": [...]},
  "set_features": {"ids": [...], "features": [[...]]}, "remove_vertices": [...]}``
  (every field optional; ``(u, v)``: ``v`` aggregates from ``u``);
- OIP tensors, for large batches: ``{"inputs": [...]}`` with any of the
  tensors of :data:`UPDATE_INPUTS` (``add_edges`` INT64 ``[m, 2]``,
  ``new_features`` FP32 ``[k, d]``, ...), as JSON data or the binary tensor
  extension (``Inference-Header-Content-Length``).

Writes need ``Authorization: Bearer TOKEN`` with the graph's token
(``graphs.tokens``, else ``graphs.write_token``): none sent is a 401, a wrong
one a 403, a graph without a token refuses every write (403). Inference needs
no token. The answer is the version that holds the batch, sent only once the
batch is durable in the store.
"""

from __future__ import annotations

import hmac
from typing import Any

from gnn_faas.config import LimitsConfig
from gnn_faas.errors import Forbidden, Unauthorized
from gnn_faas.gateway.inference_request import (
    ID_DATATYPES,
    InputSpec,
    RawInferRequest,
    load_json,
    read_tensors,
)
from gnn_faas.storage.delta import UpdateBatch

FLOAT_DATATYPES = ("FP32", "FP64", "FP16")
UPDATE_INPUTS = (
    InputSpec("add_edges", ID_DATATYPES, (-1, 2), "values", required=False),
    InputSpec("remove_edges", ID_DATATYPES, (-1, 2), "values", required=False),
    InputSpec("new_features", FLOAT_DATATYPES, (-1, -1), "values", required=False),
    InputSpec("new_labels", ID_DATATYPES, (-1,), "values", required=False),
    InputSpec("new_ids", ID_DATATYPES, (-1,), "values", required=False),
    InputSpec("feature_ids", ID_DATATYPES, (-1,), "values", required=False),
    InputSpec("features", FLOAT_DATATYPES, (-1, -1), "values", required=False),
    InputSpec("remove_vertices", ID_DATATYPES, (-1,), "values", required=False),
)


def check_token(expected: str | None, authorization: str | None, graph: str) -> None:
    """Let a write through only with ``graph``'s token (compared in constant time)."""
    if expected is None:
        raise Forbidden(
            f"updates of graph {graph!r} are disabled: no write token is configured "
            "(graphs.write_token or graphs.tokens)"
        )
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(f"updating graph {graph!r} needs 'Authorization: Bearer TOKEN'")
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Forbidden(f"the token does not allow updating graph {graph!r}")


def parse_update(
    body: bytes | RawInferRequest, limits: LimitsConfig, max_ops: int | None = None
) -> UpdateBatch:
    """The batch of a request body, in either form (see the module docstring)."""
    if isinstance(body, RawInferRequest) and body.header_length is not None:
        return UpdateBatch.from_arrays(read_tensors(body, UPDATE_INPUTS, limits), max_ops)
    raw = body.body if isinstance(body, RawInferRequest) else body
    doc = load_json(raw, limits)
    if "inputs" in doc:
        tensors: dict[str, Any] = read_tensors(doc, UPDATE_INPUTS, limits)
        return UpdateBatch.from_arrays(tensors, max_ops)
    return UpdateBatch.from_json(dict(doc), max_ops)

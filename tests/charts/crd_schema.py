"""Knative's CRD schemas (``../shared/crds``) as strict JSON Schema.

A CRD's ``openAPIV3Schema`` is converted so ``jsonschema`` validates the way
the API server prunes and validates, but strictly: descriptions dropped,
``nullable`` maps to a ``null`` type, ``x-kubernetes-int-or-string`` to integer
or string, and every object that lists ``properties`` without
``x-kubernetes-preserve-unknown-fields`` is closed (unknown fields are errors,
where the API server would silently prune them).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from tests.kube import CRDS


def to_json_schema(node):
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        else:
            out[key] = to_json_schema(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    closed = not node.get("x-kubernetes-preserve-unknown-fields")
    if node.get("type") == "object" and closed and "additionalProperties" not in node:
        out["additionalProperties"] = False
        out.setdefault("properties", {})
    return out


@cache
def crd_schema(filename: str, version: str = "v1") -> dict:
    """The strict JSON Schema of ``version`` of the CRD in ``filename``."""
    docs = [d for d in yaml.safe_load_all(Path(CRDS, filename).read_text()) if d]
    crd = next(d for d in docs if d.get("kind") == "CustomResourceDefinition")
    ver = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = to_json_schema(ver["schema"]["openAPIV3Schema"])
    # apiVersion, kind and metadata are the API server's, not the CRD's, to check
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"]["apiVersion"] = {"type": "string"}
    schema["properties"]["kind"] = {"type": "string"}
    return schema

"""The one schema of the serving config (JSON Schema, checked with ``jsonschema``).

:func:`validate` checks the YAML document before any dataclass is built and
before anything starts (``gnn-faas up`` prepares, trains or binds nothing until
it passes). Every violation is reported, each on one line naming the key path
and what the key allows, e.g.::

    serving.yaml: gateway.port: 70000 is not allowed; allowed: integer in [0, 65535]
    serving.yaml: models[0].fanouts[0]: 0 is not allowed; allowed: -1 (all) or integer in [1, 1048576]
    serving.yaml: gateway: unknown key 'prot'; known: admission, ..., threads

Types are strict: ``true`` is not an integer, ``1.0`` is not an integer (it is
a number), a section is a mapping (or empty). Every field of the config
dataclasses has an entry here (a test walks them all with a bad value).
"""

from __future__ import annotations

from typing import Any

from gnn_faas.choices import (
    ARCHS,
    CACHE_PRIORS,
    DEVICES,
    EMBEDDINGS,
    MODES,
    OBJECTIVES,
    RECOMPUTE_FROM,
    RECOMPUTE_POLICIES,
)
from gnn_faas.errors import InvalidRequest

PLATFORM_KINDS = ("local", "docker", "knative", "openfaas")  # scheduler.platform.PLATFORMS
FRONTS = ("buffered", "gthread")
_HOUR = 3600.0
_DAY = 86400.0


def _int(lo: int | None = None, hi: int | None = None, *, nullable: bool = False) -> dict:
    s: dict[str, Any] = {"type": ["integer", "null"] if nullable else "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


def _num(
    lo: float | None = None,
    hi: float | None = None,
    *,
    above: float | None = None,
    nullable: bool = False,
) -> dict:
    """A number ``>= lo`` (or ``> above``) and ``<= hi`` (or null where ``nullable``)."""
    s: dict[str, Any] = {"type": ["number", "null"] if nullable else "number"}
    if lo is not None:
        s["minimum"] = lo
    if above is not None:
        s["exclusiveMinimum"] = above
    if hi is not None:
        s["maximum"] = hi
    return s


def _enum(values: tuple[str, ...]) -> dict:
    return {"type": "string", "enum": list(values)}


def _str(nullable: bool = False, min_length: int = 0) -> dict:
    s: dict[str, Any] = {"type": ["string", "null"] if nullable else "string"}
    if min_length:
        s["minLength"] = min_length
    return s


_BOOL = {"type": "boolean"}


def _section(props: dict[str, dict]) -> dict:
    return {"type": ["object", "null"], "additionalProperties": False, "properties": props}


_POSITIVE = _int(1, 2**31 - 1)
_SECONDS = _num(above=0, hi=_DAY)

GATEWAY = _section(
    {
        "host": _str(min_length=1),
        "port": _int(0, 65535),
        "threads": _int(1, 1024),
        "request_timeout_s": _num(above=0, hi=_HOUR),
        "admission": _BOOL,
        "admission_headroom": _num(above=0, hi=10),
        "front": _enum(FRONTS),
        "max_connections": _int(1, 1_000_000),
        "header_timeout_s": _num(above=0, hi=_HOUR),
        "body_timeout_s": _num(above=0, hi=_HOUR),
        "keepalive_s": _num(1, _HOUR),
        "forward_update": _BOOL,
        "structure_budget_mb": _num(0, 1 << 20),
    }
)
LIMITS = _section(
    {
        "max_body_bytes": _int(1, 2**31),
        "max_json_depth": _int(1, 1024),
        "max_inputs": _int(1, 1024),
        "max_outputs": _int(1, 1024),
        "max_rank": _int(1, 64),
        "max_id_chars": _int(1, 1 << 20),
        "max_parameters": _int(1, 1 << 16),
        "max_values": _int(1, 2**31),
    }
)
DOCKER = _section(
    {
        "host": _str(nullable=True),
        "memory_image": _str(min_length=1),
        "compute_image": _str(min_length=1),
        "start_timeout_s": _SECONDS,
        "stop_grace_s": _num(0, _HOUR),
        "memory_aware_cache": _BOOL,
        "tmpfs_mb": _int(0, 1 << 20),
    }
)
KNATIVE = _section(
    {
        "namespace": _str(min_length=1),
        "selector": _str(),
        "kubeconfig": _str(nullable=True),
        "refresh_s": _SECONDS,
        "start_timeout_s": _SECONDS,
    }
)
OPENFAAS = _section(
    {
        "url": _str(min_length=1),
        "namespace": _str(nullable=True),
        "selector": _str(),
        "user_env": _str(min_length=1),
        "password_env": _str(min_length=1),
        "gateway_scaling": _BOOL,
        "concurrency": _int(1, 1 << 16),
        "refresh_s": _SECONDS,
        "start_timeout_s": _SECONDS,
        # "NAMESPACE/NAME" of OpenFaaS's basic-auth Secret
        "credentials_secret": {"type": ["string", "null"], "pattern": "^[a-z0-9-]+/[a-z0-9.-]+$"},
        "user_key": _str(min_length=1),
        "password_key": _str(min_length=1),
        "kubeconfig": _str(nullable=True),
    }
)
PLATFORM = _section(
    {
        "kind": _enum(PLATFORM_KINDS),
        "keep_alive_s": _num(0, 7 * _DAY),
        "memory_function_mb": _int(16, 1 << 20),
        "compute_function_mb": _int(16, 1 << 20),
        "memory_vcpus": _num(above=0, hi=1024),
        "compute_vcpus": _num(above=0, hi=1024),
        "max_memory_instances": _int(1, 10_000),
        "max_compute_instances": _int(1, 10_000),
        "min_instances": _int(0, 10_000),
        "runtime_mb": _int(1, 1 << 20),
        "docker": DOCKER,
        "knative": KNATIVE,
        "openfaas": OPENFAAS,
    }
)
BUFFERS = _section(
    {
        "num_buffers": _int(1, 1024),
        "gamma": _num(0, 1),
        "delta": _num(above=0, hi=1),
        "tau_fraction": _num(above=0, hi=1),
        "max_steps": _int(1, 1000),
        "alpha": _num(0, 1e6),
        "beta": _num(0, 1e6),
        "max_requests_per_buffer": _int(1, 1 << 20),
        "exec_estimate_s": _num(0, _HOUR),
        "global_opt": _BOOL,
        "tree": _str(nullable=True),
        "objective": _enum(OBJECTIVES),
        "latency_slack": _num(0, 1e6),
    }
)
MODEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"},
        "graph": _str(min_length=1),
        "dataset": _str(nullable=True),
        "checkpoint": _str(nullable=True),
        "arch": _enum(ARCHS),
        "layers": _int(1, 16),
        "hidden": _int(1, 1 << 16),
        "epochs": _int(1, 1 << 20),
        "slo_s": _num(above=0, hi=_HOUR),
        # per hop: neighbours sampled per vertex, or -1 for all of them (PyG's convention)
        "fanouts": {
            "type": ["array", "null"],
            "items": {"anyOf": [{"const": -1, "description": "all"}, _int(1, 1 << 20)]},
            "minItems": 1,
        },
        "max_targets": _int(1, 1 << 24),
        "mode": _enum(MODES),
        "embeddings": _enum(EMBEDDINGS),
        "recompute_budget": _num(0, 1),
        "recompute_policy": _enum(RECOMPUTE_POLICIES),
        "recompute_from": _enum(RECOMPUTE_FROM),
        "max_new_vertices": _int(0, 1 << 24),
        "max_new_edges": _int(0, 1 << 30),
        "cache_prior": _enum(CACHE_PRIORS),
        "device": _enum(DEVICES),
        # this model's function sizes where they differ from platform.*
        "memory_function_mb": _int(16, 1 << 20, nullable=True),
        "compute_function_mb": _int(16, 1 << 20, nullable=True),
        "memory_vcpus": _num(above=0, hi=1024, nullable=True),
        "compute_vcpus": _num(above=0, hi=1024, nullable=True),
        # the model's own buffer objective (null: the buffers section's)
        "buffers": _section(
            {
                "objective": {"type": ["string", "null"], "enum": [*OBJECTIVES, None]},
                "latency_slack": _num(0, 1e6, nullable=True),
            }
        ),
    },
}
GRAPHS = _section(
    {
        "freshness_s": _num(0, _HOUR),
        "write_token": _str(nullable=True),
        "tokens": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"graph": _str(min_length=1), "token": _str(min_length=1)},
            },
        },
        "compact_share": _num(0, 1e6),
        "compaction_grace_s": _num(0, _DAY),
        "max_batch_ops": _int(1, 2**31 - 1),
    }
)
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "gnn-faas serving config",
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "store": _str(),
        "gateway": GATEWAY,
        "platform": PLATFORM,
        "buffers": BUFFERS,
        "limits": LIMITS,
        "graphs": GRAPHS,
        "models": {"type": "array", "items": MODEL, "minItems": 1},
    },
}


def describe(schema: dict) -> str:
    """What a (sub)schema allows, in words: ``integer in [0, 65535]``, ``one of ...``."""
    if "anyOf" in schema:
        return " or ".join(describe(sub) for sub in schema["anyOf"])
    if "const" in schema:
        note = schema.get("description")
        return repr(schema["const"]) + (f" ({note})" if note else "")
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    nullable = "null" in types
    types = [t for t in types if t != "null"]
    kind = types[0] if types else "value"
    if kind == "object":
        text = "a mapping"
    elif kind == "array":
        text = "a list"
        if "items" in schema:
            text += " of " + describe(schema["items"])
        if schema.get("minItems"):
            text += f" (at least {schema['minItems']})"
    else:
        text = {"number": "number", "integer": "integer"}.get(kind, kind)
        lo, hi = schema.get("minimum"), schema.get("maximum")
        above = schema.get("exclusiveMinimum")
        if lo is not None and hi is not None:
            text += f" in [{_fmt(lo)}, {_fmt(hi)}]"
        elif above is not None and hi is not None:
            text += f" in ({_fmt(above)}, {_fmt(hi)}]"
        elif lo is not None:
            text += f" >= {_fmt(lo)}"
        elif above is not None:
            text += f" > {_fmt(above)}"
        if schema.get("minLength"):
            text = "a non-empty string" if kind == "string" else text
        if "pattern" in schema:
            text += f" matching {schema['pattern']}"
    return text + (" or null" if nullable else "")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _validator():
    import jsonschema

    base = jsonschema.Draft202012Validator
    # strict: an integer is an int (not a bool, not 1.0); a number is an int or a float
    checker = base.TYPE_CHECKER.redefine_many(
        {
            "integer": lambda _c, v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda _c, v: isinstance(v, (int, float)) and not isinstance(v, bool),
        }
    )
    return jsonschema.validators.extend(base, type_checker=checker)(SCHEMA)


def errors(data: Any) -> list[str]:
    """One line per violation of :data:`SCHEMA` in ``data`` (empty: valid)."""
    lines, seen = [], set()
    for err in sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.path))):
        where = _path(err.absolute_path)
        if where in seen and err.validator != "additionalProperties":
            continue  # one line per key (a value off the enum is of the wrong type too)
        seen.add(where)
        if err.validator == "additionalProperties":
            known = sorted(err.schema.get("properties", {}))
            extra = sorted(set(err.instance) - set(known))
            lines.append(
                f"{where}: unknown key(s) {', '.join(map(repr, extra))}; known: {', '.join(known)}"
            )
        elif err.validator == "minItems" and not err.instance:
            lines.append(f"{where}: must not be empty; allowed: {describe(err.schema)}")
        else:
            value = repr(err.instance)
            if len(value) > 60:
                value = value[:57] + "..."
            lines.append(f"{where}: {value} is not allowed; allowed: {describe(err.schema)}")
    return lines


def validate(data: Any, source: str = "config") -> None:
    """Raise :class:`InvalidRequest` listing every violation, one line each."""
    lines = errors(data)
    if lines:
        raise InvalidRequest("\n".join(f"{source}: {line}" for line in lines))

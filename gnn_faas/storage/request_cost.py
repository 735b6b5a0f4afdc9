"""What a storage request costs: measured per-backend constants of a linear model.

A batched range read of ``R`` requests moving ``B`` bytes is modelled as::

    cost(R, B) = round_trip_s + R·per_request_s + B·per_byte_s      (seconds)

``round_trip_s`` is paid once per batch whatever the plan, so only
``per_request_s`` (an S3 GET's first-byte latency shared over the concurrent
GETs of a batch, a Redis command in a pipeline, a gather's seek into a mapped
file) and ``per_byte_s`` (the inverse of the bandwidth) steer the range
planner (:func:`gnn_faas.storage.ranges.coalesce`): merging two neighbouring
ranges across a gap of ``g`` bytes saves one request and reads ``g`` more
bytes, which pays iff ``g < per_request_s / per_byte_s`` (:attr:`RequestCost.max_gap`).

The constants are measured, never typed in: ``gnn-faas bench storage-constants
--store URI --save`` (:mod:`gnn_faas.bench.storage_constants`) times batches of
many small ranges and of single large ones against the store and fits the
model by non-negative least squares; ``--save`` writes the result into the
store itself at :data:`STORE_KEY`, where every reader of that store finds it.
A store without one uses the bundled ``gnn_faas/data/storage_constants.json``,
which the same command measured (each entry names the command, the store and
the date); the dollars of a request are the price file's business
(:mod:`gnn_faas.traces.cost`), not this model's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.paths import BUNDLED_DATA

FORMAT = "gnn-faas-storage-constants"
VERSION = 1
BUNDLED_FILE = BUNDLED_DATA / "storage_constants.json"
STORE_KEY = "_gnn-faas/storage-constants.json"


@dataclass(frozen=True)
class RequestCost:
    """Measured constants of one store (see the module docstring)."""

    scheme: str
    per_request_s: float
    per_byte_s: float
    round_trip_s: float = 0.0
    measured: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("per_request_s", "per_byte_s", "round_trip_s"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise InvalidRequest(f"storage constants: {name} must be a number >= 0, not {v!r}")

    @property
    def max_gap(self) -> float:
        """Bytes below which a gap is cheaper read than skipped: ``per_request_s / per_byte_s``
        (infinite where bytes are free, 0 where requests are)."""
        if self.per_request_s == 0:
            return 0.0
        if self.per_byte_s == 0:
            return math.inf
        return self.per_request_s / self.per_byte_s

    def cost(self, requests: int | float, nbytes: int | float) -> float:
        """Modelled seconds of one batch of ``requests`` requests moving ``nbytes`` bytes."""
        return self.round_trip_s + requests * self.per_request_s + nbytes * self.per_byte_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_request_s": self.per_request_s,
            "per_byte_s": self.per_byte_s,
            "round_trip_s": self.round_trip_s,
            "max_gap_bytes": None if math.isinf(self.max_gap) else self.max_gap,
            "measured": dict(self.measured),
        }


FREE = RequestCost("", 0.0, 0.0, measured={"note": "no constants: ranges are never widened"})


def parse_constants(data: Any, source: str) -> dict[str, RequestCost]:
    """``{scheme: RequestCost}`` from a constants document (see :func:`document`)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidRequest(f"{source}: not a {FORMAT} document")
    if data.get("version") != VERSION:
        raise InvalidRequest(f"{source}: unsupported version {data.get('version')!r}")
    backends = data.get("backends")
    if not isinstance(backends, dict):
        raise InvalidRequest(f"{source}: expected a 'backends' mapping")
    out = {}
    for scheme, entry in backends.items():
        if not isinstance(entry, dict):
            raise InvalidRequest(f"{source}: backend {scheme!r} must be a mapping")
        missing = [k for k in ("per_request_s", "per_byte_s", "measured") if k not in entry]
        if missing:
            raise InvalidRequest(f"{source}: backend {scheme!r} lacks {missing}")
        measured = entry["measured"]
        if not isinstance(measured, dict) or "command" not in measured:
            raise InvalidRequest(f"{source}: backend {scheme!r}: 'measured' must name its command")
        try:
            out[scheme] = RequestCost(
                scheme,
                float(entry["per_request_s"]),
                float(entry["per_byte_s"]),
                float(entry.get("round_trip_s", 0.0)),
                measured,
            )
        except (TypeError, ValueError):
            raise InvalidRequest(
                f"{source}: backend {scheme!r}: constants must be numbers"
            ) from None
    return out


def document(costs: dict[str, RequestCost], note: str | None = None) -> dict[str, Any]:
    """The JSON document holding ``costs`` (the inverse of :func:`parse_constants`)."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "backends": {s: c.to_dict() for s, c in sorted(costs.items())},
    }
    if note:
        doc["note"] = note
    return doc


def load_constants(path: str | Path | None = None) -> dict[str, RequestCost]:
    """Constants from a file (default: the bundled one)."""
    p = Path(path) if path else BUNDLED_FILE
    if not p.is_file():
        raise NotFound(f"storage constants file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{p}: not JSON ({exc})") from None
    return parse_constants(data, str(p))


def constants_for(backend: Any) -> RequestCost:
    """The constants a reader of ``backend`` plans with: those saved in the store
    (:data:`STORE_KEY`) for its scheme, else the bundled ones, else :data:`FREE`.
    Looked up once per backend instance."""
    cached = getattr(backend, "_request_cost", None)
    if cached is not None:
        return cached
    scheme = getattr(backend, "scheme", "")
    cost = None
    if backend.exists(STORE_KEY):
        raw = backend.cat_file(STORE_KEY)
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"{backend.uri}: {STORE_KEY} is not JSON ({exc})") from None
        cost = parse_constants(data, f"{backend.uri}/{STORE_KEY}").get(scheme)
    if cost is None:
        cost = load_constants().get(scheme, FREE)
    backend._request_cost = cost
    return cost

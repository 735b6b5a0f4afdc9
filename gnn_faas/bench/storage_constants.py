"""``gnn-faas bench storage-constants``: measure what a request and a byte cost on a store.

The range planner (:func:`gnn_faas.storage.ranges.coalesce`) minimises
``requests·per_request_s + bytes·per_byte_s`` per batch; this measures the two
constants (and the per-batch ``round_trip_s``) on the store itself:

1. writes a probe blob of ``--blob-mib`` MiB of random bytes under ``_gnn-faas/``;
2. times batched reads (``read_ranges``, the call the fetcher makes, without
   the planner in between) of two shapes: ``R`` small ranges of
   ``--small-bytes`` bytes spread over the blob (``R`` = 1, 2, 4 .. 256) and
   one range of ``B`` bytes (64 KiB .. the blob); each point is the median of
   at least ``--repeats`` timings (more while they add up to under 50 ms);
3. fits ``t = round_trip_s + R·per_request_s + B·per_byte_s`` over all points
   by non-negative least squares (``scipy.optimize.nnls``, columns scaled) and
   reports it with its R² and ``max_gap_bytes = per_request_s / per_byte_s``;
4. removes the probe; ``--save`` writes the constants into the store
   (:data:`gnn_faas.storage.request_cost.STORE_KEY`, where every reader of the
   store finds them), ``--out FILE`` into a constants file (other backends'
   entries in it are kept).
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.request_cost import (
    STORE_KEY,
    RequestCost,
    document,
    load_constants,
    parse_constants,
)

REQUEST_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_POINT_S = 0.05


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URI to measure")
    p.add_argument("--blob-mib", type=float, default=16.0, help="probe blob size (MiB)")
    p.add_argument("--small-bytes", type=int, default=512, help="bytes of each small range")
    p.add_argument("--repeats", type=int, default=5, help="timings per point (at least)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe bytes")
    p.add_argument("--out", default=None, help="write (merge) the constants into this JSON file")
    p.add_argument("--save", action="store_true", help=f"write them into the store ({STORE_KEY})")
    p.add_argument("--note", default=None, help="a line saying where and how they were measured")


def _time_point(backend: StorageBackend, key: str, starts, ends, repeats: int) -> float:
    """Median seconds of ``read_ranges`` over at least ``repeats`` runs."""
    times: list[float] = []
    total = 0.0
    while len(times) < repeats or (total < MIN_POINT_S and len(times) < 200):
        t0 = time.perf_counter()
        backend.read_ranges(key, starts, ends)
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    return float(np.median(times))


def design_points(blob_bytes: int, small: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches timed: ``R`` small ranges spread evenly over the blob (gaps
    far larger than the ranges, so none touch), then single ranges doubling
    from 64 KiB up to the blob."""
    points = []
    for r in REQUEST_COUNTS:
        starts = (
            np.linspace(0, blob_bytes - small, r).astype(np.int64)
            if r > 1
            else np.zeros(1, np.int64)
        )
        points.append((starts, starts + small))
    size = 64 << 10
    while size < blob_bytes:
        points.append((np.zeros(1, np.int64), np.array([size], np.int64)))
        size *= 4
    points.append((np.zeros(1, np.int64), np.array([blob_bytes], np.int64)))
    return points


def fit(
    requests: np.ndarray, nbytes: np.ndarray, seconds: np.ndarray
) -> tuple[float, float, float, float]:
    """``(round_trip_s, per_request_s, per_byte_s, r2)`` by non-negative least squares."""
    from scipy.optimize import nnls

    a = np.column_stack([np.ones(requests.size), requests, nbytes]).astype(np.float64)
    scale = np.abs(a).max(axis=0)
    x, _ = nnls(a / scale, seconds)
    x = x / scale
    pred = a @ x
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    r2 = 1.0 - float(((seconds - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return float(x[0]), float(x[1]), float(x[2]), r2


def measure(backend: StorageBackend, args: argparse.Namespace) -> tuple[RequestCost, list[dict]]:
    blob_bytes = int(args.blob_mib * 2**20)
    if blob_bytes < 4 * args.small_bytes * REQUEST_COUNTS[-1]:
        raise InvalidRequest("--blob-mib too small for the spread of small ranges")
    key = f"_gnn-faas/probe-{secrets.token_hex(4)}.bin"
    data = np.random.default_rng(args.seed).integers(0, 256, blob_bytes, dtype=np.uint8)
    backend.pipe_file(key, data.tobytes())
    try:
        points = design_points(blob_bytes, args.small_bytes)
        # one untimed pass warms connections and caches
        for starts, ends in points:
            backend.read_ranges(key, starts, ends)
        seconds = np.array([_time_point(backend, key, s, e, args.repeats) for s, e in points])
    finally:
        backend.rm(key)
    requests = np.array([s.size for s, _ in points], dtype=np.float64)
    nbytes = np.array([int((e - s).sum()) for s, e in points], dtype=np.float64)
    rt, per_req, per_byte, r2 = fit(requests, nbytes, seconds)
    measured = {
        "command": f"gnn-faas bench storage-constants --store {backend.uri} --blob-mib {args.blob_mib:g}",
        "store": backend.uri,
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "r2": r2,
        "points": len(points),
    }
    if args.note:
        measured["note"] = args.note
    cost = RequestCost(backend.scheme, per_req, per_byte, rt, measured)
    table = [
        {"requests": int(r), "bytes": int(b), "ms": float(t * 1e3)}
        for r, b, t in zip(requests, nbytes, seconds, strict=True)
    ]
    return cost, table


def merged_document(
    existing: dict[str, RequestCost], cost: RequestCost, note: str | None
) -> dict[str, Any]:
    return document({**existing, cost.scheme: cost}, note)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.repeats < 1:
        raise InvalidRequest("--repeats must be at least 1")
    if args.small_bytes < 1 or args.blob_mib <= 0:
        raise InvalidRequest("--small-bytes and --blob-mib must be positive")
    backend = open_backend(args.store)
    try:
        cost, table = measure(backend, args)
        if args.save:
            existing = {}
            if backend.exists(STORE_KEY):
                existing = parse_constants(json.loads(backend.cat_file(STORE_KEY)), STORE_KEY)
            body = json.dumps(merged_document(existing, cost, args.note), indent=1, sort_keys=True)
            backend.pipe_file(STORE_KEY, body.encode())
    finally:
        backend.close()
    if args.out:
        out = Path(args.out)
        existing, note = {}, args.note
        if out.is_file():
            existing = load_constants(out)
            note = note or json.loads(out.read_text()).get("note")
        doc = merged_document(existing, cost, note)
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return {
        "backend": cost.scheme,
        **cost.to_dict(),
        "timings": table,
        "saved": STORE_KEY if args.save else None,
        "out": args.out,
    }

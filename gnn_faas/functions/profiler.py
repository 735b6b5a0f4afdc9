"""Profiles of memory-function requests, and the peak predictor fitted on them.

A profiled request is what a memory function serves, run through the same
code as :mod:`gnn_faas.functions.memory_app`: targets taken in the graph's
real request order (``request_order.bin``; a seeded permutation where there is
none) in batches of 1..64, a 1..3-hop computation graph (full or sampled
neighbourhoods, seeded), then per layer one ``/v1/aggregate`` call (the frame
decoded exactly as the app decodes it; layer 1 reads the input rows through a
feature cache that holds nothing, the worst case; later layers ship rows of a
hidden width) and, for GAT, the ``/v1/features`` read that feeds its ``pre``.
Each call's peak is measured with ``tracemalloc`` around the same ``work`` the
app measures (:func:`~gnn_faas.functions.feature_cache.measure_peak`).

:func:`fit_predictor` fits scikit-learn's ``MLPRegressor`` (one hidden layer
of 16 ReLU units, L-BFGS) on standardised log-features to the standardised
log peak, holding out whole requests for the error report, and exports the
weights to a numpy-only :class:`~gnn_faas.functions.peak_predictor.PeakPredictor`.
sklearn is imported only here, never by a serving memory function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.feature_cache import FeatureCache, measure_peak
from gnn_faas.functions.memory_app import execute_aggregate, parse_aggregate
from gnn_faas.functions.peak_predictor import (
    PeakPredictor,
    RequestShape,
    shape_features,
)
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle
from gnn_faas.wire import decode_frame, encode_frame

PROFILE_OPS = ("gcn", "mean", "max", "sum", "gin", "gat")
HIDDEN_WIDTHS = (16, 32, 64, 128)


@dataclass(frozen=True)
class Profile:
    """One measured call: its shape and peak."""

    request: int  # which profiled request it belongs to
    layer: int  # 0 for a features read
    num_dst: int
    num_src: int
    num_edges: int
    width: int
    op: str
    loads_rows: bool
    peak_bytes: int
    seconds: float

    @property
    def shape(self) -> RequestShape:
        return RequestShape(
            self.num_dst, self.num_src, self.num_edges, self.width, self.op, self.loads_rows
        )


def _batches(order: np.ndarray, n: int, rng: np.random.Generator, max_batch: int):
    pos = 0
    for _ in range(n):
        b = int(rng.integers(1, max_batch + 1))
        if pos + b > order.size:
            pos = 0
        yield order[pos : pos + b]
        pos += b


def profile_requests(
    graph: GraphHandle,
    requests: int = 200,
    seed: int = 0,
    max_batch: int = 64,
    max_hops: int = 3,
    ops: tuple[str, ...] = PROFILE_OPS,
) -> list[Profile]:
    """Record the peaks of ``requests`` real-order requests on ``graph``."""
    if requests < 1:
        raise InvalidRequest("requests must be >= 1")
    rng = np.random.default_rng(seed)
    fetcher = KHopFetcher(graph)
    dim = int(np.prod(graph.info("features").shape[1:], dtype=np.int64))
    if graph.has("request_order"):
        order = np.asarray(graph.read_blob("request_order"), dtype=np.int64)
    else:
        order = rng.permutation(graph.num_nodes).astype(np.int64)
    empty = FeatureCache(graph.num_nodes, dim, policy=None)
    empty.set_capacity(0)
    out: list[Profile] = []

    def loader(ids: np.ndarray) -> np.ndarray:
        return fetcher.read_features(ids)

    for r, targets in enumerate(_batches(order, requests, rng, max_batch)):
        hops = int(rng.integers(1, max_hops + 1))
        sampled = bool(rng.random() < 0.5)
        fanouts = [int(f) for f in rng.choice([5, 10, 15, 25], size=hops)] if sampled else None
        op = str(rng.choice(ops))
        cg = fetcher.fetch(targets, hops, fanouts=fanouts, seed=int(seed + r), degrees=True)
        heads = int(rng.choice([1, 2, 4]))
        for layer in range(1, hops + 1):
            block = cg.block(layer)
            src_ids = cg.nodes[: block.num_src]
            tensors = {
                "indptr": block.indptr.astype(np.int64),
                "indices": block.indices.astype(np.int64),
                "src_ids": src_ids,
            }
            params: dict[str, Any] = {"op": op, "num_dst": block.num_dst}
            width = dim
            if op == "gat":
                chans = int(rng.choice(HIDDEN_WIDTHS)) // heads
                width = heads * chans
                tensors["h"] = rng.standard_normal((block.num_src, heads, chans), np.float32)
                tensors["alpha_src"] = rng.standard_normal((block.num_src, heads), np.float32)
                tensors["alpha_dst"] = rng.standard_normal((block.num_dst, heads), np.float32)
                if layer == 1:  # the input rows gat's pre needs
                    shape = RequestShape(block.num_src, block.num_src, 0, dim, "features")

                    def feat(ids=src_ids):
                        return encode_frame({"x": empty.get_rows(ids, loader)})

                    t0 = time.perf_counter()
                    _, peak = measure_peak(feat)
                    out.append(_record(r, 0, shape, peak, time.perf_counter() - t0))
            elif layer > 1:
                width = int(rng.choice(HIDDEN_WIDTHS))
                tensors["h"] = rng.standard_normal((block.num_src, width), np.float32)
            if op == "gcn":
                tensors["deg_src"] = cg.in_degree[: block.num_src]
            if op == "mean" and rng.random() < 0.5:
                params["return_root"] = True
            body = encode_frame(tensors, params)
            call = parse_aggregate(*decode_frame(body))
            shape = call.shape(dim)

            def work(call=call):
                rows = call.h if call.h is not None else empty.get_rows(call.src_ids, loader)
                return encode_frame(execute_aggregate(call, rows))

            t0 = time.perf_counter()
            _, peak = measure_peak(work)
            out.append(_record(r, layer, shape, peak, time.perf_counter() - t0))
    return out


def _record(r: int, layer: int, s: RequestShape, peak: int, seconds: float) -> Profile:
    return Profile(
        r, layer, s.num_dst, s.num_src, s.num_edges, s.width, s.op, s.loads_rows, int(peak), seconds
    )


def relative_errors(predictor: PeakPredictor, profiles: list[Profile]) -> np.ndarray:
    """``|predicted - measured| / measured`` per profile."""
    rows = np.array([p.shape.as_row() for p in profiles])
    actual = np.array([p.peak_bytes for p in profiles], dtype=np.float64)
    return np.abs(predictor.predict_rows(rows) - actual) / np.maximum(actual, 1.0)


def split_by_request(
    profiles: list[Profile], test_fraction: float, seed: int
) -> tuple[list[Profile], list[Profile]]:
    """Hold out whole requests (all their calls) for testing."""
    reqs = np.unique([p.request for p in profiles])
    rng = np.random.default_rng(seed)
    test = set(rng.choice(reqs, size=max(1, int(round(test_fraction * reqs.size))), replace=False))
    return [p for p in profiles if p.request not in test], [
        p for p in profiles if p.request in test
    ]


def fit_predictor(
    profiles: list[Profile],
    seed: int = 0,
    hidden: int = 16,
    meta: dict[str, Any] | None = None,
) -> PeakPredictor:
    """Fit the 2-layer MLP (sklearn) on ``profiles`` and export it to numpy."""
    from sklearn.neural_network import MLPRegressor

    if len(profiles) < 8:
        raise InvalidRequest(f"need at least 8 profiles to fit, got {len(profiles)}")
    x = shape_features(np.array([p.shape.as_row() for p in profiles]))
    y = np.log(np.maximum([p.peak_bytes for p in profiles], 1.0))
    x_mean, x_scale = x.mean(axis=0), x.std(axis=0)
    x_scale[x_scale == 0] = 1.0
    y_mean, y_scale = float(y.mean()), float(y.std() or 1.0)
    mlp = MLPRegressor(
        hidden_layer_sizes=(hidden,),
        activation="relu",
        solver="lbfgs",
        alpha=1e-4,
        max_iter=5000,
        random_state=seed,
    )
    mlp.fit((x - x_mean) / x_scale, (y - y_mean) / y_scale)
    return PeakPredictor(
        mlp.coefs_[0],
        mlp.intercepts_[0],
        mlp.coefs_[1][:, 0],
        mlp.intercepts_[1],
        x_mean,
        x_scale,
        y_mean,
        y_scale,
        meta=dict(meta or {}, profiles=len(profiles), hidden=hidden, seed=seed),
    )


def profile_and_fit(
    graph: GraphHandle,
    requests: int = 300,
    seed: int = 0,
    test_fraction: float = 0.25,
    max_batch: int = 64,
    max_hops: int = 3,
) -> tuple[PeakPredictor, dict[str, Any]]:
    """Profile, fit on the training requests, report the held-out error, then
    refit on everything (the shipped predictor sees all profiles)."""
    t0 = time.perf_counter()
    profiles = profile_requests(graph, requests, seed, max_batch, max_hops)
    train, test = split_by_request(profiles, test_fraction, seed)
    held = fit_predictor(train, seed)
    err = relative_errors(held, test)
    meta = {
        "graph": graph.name,
        "feature_dim": int(np.prod(graph.info("features").shape[1:], dtype=np.int64)),
        "requests": requests,
        "heldout_median_rel_error": float(np.median(err)),
        "heldout_p90_rel_error": float(np.quantile(err, 0.9)),
    }
    final = fit_predictor(profiles, seed, meta=meta)
    report = {
        **meta,
        "profiles": len(profiles),
        "train_profiles": len(train),
        "test_profiles": len(test),
        "peak_bytes_min": int(min(p.peak_bytes for p in profiles)),
        "peak_bytes_max": int(max(p.peak_bytes for p in profiles)),
        "seconds": time.perf_counter() - t0,
    }
    return final, report


__all__ = [
    "Profile",
    "fit_predictor",
    "profile_and_fit",
    "profile_requests",
    "relative_errors",
    "split_by_request",
]

"""Storage requests per policy: a per-fetch model measured on the graph, priced.

What a fetch of a computation graph costs in requests depends only on the
range planner's constants (:mod:`gnn_faas.storage.request_cost`), not on the
backend that serves the bytes: :func:`measure_fetch_requests` runs the real
fetcher (:class:`~gnn_faas.storage.fetcher.KHopFetcher`, k-hop fetch plus the
feature rows) planning with the priced store's constants (default the bundled
``s3`` ones) on single targets from the graph's request order and on merged
groups of 2..8 of them (what a shared buffer fetches), and fits
``requests(rows) = per_fetch + per_row·rows`` (``rows``: the fetch's input
vertices). :func:`storage_per_policy` turns it, with each policy's simulated
or live figures, into requests and dollars (:mod:`gnn_faas.traces.cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gnn_faas.traces.calibration import fit_linear
from gnn_faas.traces.cost import Price, policy_storage_requests, storage_dollars

GROUPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class FetchRequests:
    """Measured storage requests of one graph's fetches under one store's constants."""

    scheme: str
    per_fetch: float
    per_row: float
    full_download: int  # GETs to download the whole graph (manifest + one per blob)
    graph_gib: float
    fetches: int  # fetches measured
    rows_per_request: float  # mean input rows of a single-target fetch

    def as_dict(self) -> dict:
        return asdict(self)


def measure_fetch_requests(
    graph: Any, hops: int, targets: np.ndarray, scheme: str = "s3", per_group: int = 2,
    fanouts: Sequence[int] | None = None,
) -> FetchRequests:  # fmt: skip
    """Fit the per-fetch requests on ``per_group`` fetches of each group size in
    :data:`GROUPS`, the targets taken in order (``targets``: the request order),
    neighbourhoods sampled with ``fanouts`` (``None``: full).

    A line ``per_fetch + per_row·rows`` approximates a curve: GETs grow with the
    rows while they are sparse in the file and fall once a fetch covers most of
    it (the range planner's byte budget then lets its reads merge), so on a small
    graph single-target fetches make more GETs than the line says (1.5x on
    Bitcoin OTC)."""
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.request_cost import load_constants

    cost = load_constants().get(scheme)
    if cost is None:
        raise ValueError(f"no bundled storage constants for {scheme!r}")
    fetcher = KHopFetcher(graph, cost)
    rows, gets, single_rows = [], [], []
    k = 0
    targets = np.asarray(targets, dtype=np.int64)
    for size in GROUPS:
        for _ in range(per_group):
            ts = targets[(k + np.arange(size)) % targets.size]
            k += size
            before = fetcher.stats.ranges_requested
            cg = fetcher.fetch(ts, hops, fanouts)
            fetcher.read_features(cg.input_nodes)
            rows.append(int(cg.input_nodes.size))
            gets.append(fetcher.stats.ranges_requested - before)
            if size == 1:
                single_rows.append(rows[-1])
    a, b = fit_linear(np.asarray(rows, np.float64), np.asarray(gets, np.float64))
    blobs = list(graph.manifest.blobs)
    nbytes = sum(graph.info(k).nbytes for k in blobs)
    return FetchRequests(
        scheme=scheme,
        per_fetch=a,
        per_row=b,
        full_download=1 + len(blobs),
        graph_gib=nbytes / 2**30,
        fetches=len(rows),
        rows_per_request=float(np.mean(single_rows)),
    )


def storage_per_policy(
    summaries: dict[str, dict],
    model: FetchRequests,
    prices: dict[str, Price],
    duration_s: float,
) -> dict[str, dict]:
    """Per policy: its storage GETs (:func:`policy_storage_requests`) and their
    dollars under every storage price, beside the compute ``dollars``."""
    out = {}
    for name, s in summaries.items():
        gets = policy_storage_requests(
            name, s, per_fetch=model.per_fetch, per_row=model.per_row,
            full_download=model.full_download, rows_per_request=model.rows_per_request,
        )  # fmt: skip
        out[name] = {
            "gets": gets,
            "gets_per_request": gets / max(s["requests"], 1),
            "dollars": storage_dollars(
                prices,
                gets=gets,
                duration_s=duration_s,
                graph_gib=model.graph_gib,
                requests=s["requests"],
            ),  # fmt: skip
        }
    return out

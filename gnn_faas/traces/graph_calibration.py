"""``gnn-faas simulate calibrate-graph``: a calibration whose graph figures are
measured on the graph itself.

It keeps the platform's figures from a live-measured base profile
(``--calibration``, default the bundled Bitcoin OTC one: cold starts, idle memory,
sizes, keep-alive, the memory share of an execution) and measures what depends on
the graph, from its store:

- ``full_fetch_s``, ``graph_mb``: the median time to read every blob of the graph,
  and its size (what a DGL-serverless or serverful instance loads at start-up);
- ``row_bytes``: from the manifest;
- the execution fit ``T(rows) = a + b·rows``: executions run in this process
  through the serving code (k-hop fetch and feature read with the real
  :class:`~gnn_faas.storage.fetcher.KHopFetcher`, per layer the memory function's
  ``mean`` aggregation and a dense update to ``--hidden`` columns) on single targets
  and merged groups of 2 and 4 from the request order, timed in CPU seconds of
  this process; ``rows`` is the union of their k-hop sets, sampled with
  ``--fanouts`` when given (stored in the calibration for ``simulate``). The base
  profile's intercept (the live HTTP hops) is added to the fitted one.

``--max-instances`` sets ``max_instances``, a deployment choice. Why CPU time and
a live base: docs/design/graph-calibration.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.calibration import Calibration, fit_linear
from gnn_faas.traces.measure_calibration import full_fetch_seconds
from gnn_faas.traces.request_stream import request_order

GROUP_SIZES = (1, 2, 4)


def measure_executions(
    graph: Any, hops: int, order: np.ndarray, *, hidden: int = 64, per_group: int = 3,
    seed: int = 0, fanouts: Sequence[int] | None = None,
) -> list[tuple[int, float]]:  # fmt: skip
    """``(union rows, seconds)`` of executions of ``per_group`` groups of each
    size in :data:`GROUP_SIZES`, targets in request order, neighbourhoods
    sampled with ``fanouts`` (``None``: full)."""
    from gnn_faas.functions.aggregate import aggregate
    from gnn_faas.storage.fetcher import KHopFetcher

    fetcher = KHopFetcher(graph)
    rng = np.random.default_rng(seed)
    dims = [graph.manifest.feature_dim] + [hidden] * hops
    weights = [
        (rng.standard_normal((dims[i], dims[i + 1])) / np.sqrt(dims[i])).astype(np.float32)
        for i in range(hops)
    ]
    out: list[tuple[int, float]] = []
    k = 0
    for size in GROUP_SIZES:
        for _ in range(per_group):
            targets = order[(k + np.arange(size)) % order.size]
            k += size
            t0 = time.process_time()
            cg = fetcher.fetch(targets, hops, fanouts)
            h = fetcher.read_features(cg.input_nodes)
            for block, w in zip(cg.blocks(), weights, strict=True):
                h = np.maximum(aggregate("mean", block, h) @ w, 0.0)
            out.append((int(cg.input_nodes.size), time.process_time() - t0))
    return out


def calibrate_graph(
    base: Calibration,
    graph: Any,
    store: str,
    *,
    max_instances: int | None = None,
    hidden: int = 64,
    per_group: int = 3,
    repeats: int = 1,
    fanouts: Sequence[int] | None = None,
    log=print,
) -> Calibration:
    hops = base.hops
    if fanouts is not None and len(fanouts) != hops:
        raise InvalidRequest(f"--fanouts needs one fanout per hop ({hops}), got {len(fanouts)}")
    log(f"timing full downloads of {graph.name} ...")
    fetch_s, graph_mb = full_fetch_seconds(store, graph.name, repeats)
    log(f"full download: {graph_mb:.0f} MiB in {fetch_s:.2f} s; timing executions ...")
    samples = measure_executions(
        graph, hops, request_order(graph), hidden=hidden, per_group=per_group, fanouts=fanouts
    )
    a, b = fit_linear(*np.asarray(samples, dtype=np.float64).T)
    m = graph.manifest
    row_bytes = m.feature_dim * 4 * (1 + hops) + 12 * m.num_edges / max(m.num_nodes, 1)
    cap = base.max_instances if max_instances is None else int(max_instances)
    sampled = fanouts is not None and any(f >= 0 for f in fanouts)
    fan = tuple(int(f) for f in fanouts) if sampled else None
    fan_flag = f" --fanouts {','.join(map(str, fan))}" if fan else ""
    return replace(
        base,
        graph=graph.name,
        exec_intercept_s=base.exec_intercept_s + a,
        exec_per_row_s=b,
        samples=tuple((r, base.exec_intercept_s + s) for r, s in samples),
        row_bytes=float(row_bytes),
        graph_mb=float(graph_mb),
        full_fetch_s=float(fetch_s),
        max_instances=cap,
        fanouts=fan,
        meta={
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": f"gnn-faas simulate calibrate-graph --graph {graph.name} --store STORE "
            f"--max-instances {cap}{fan_flag} --out FILE",
            "platform_from": base.meta,
            "graph_shape": {
                "vertices": m.num_nodes,
                "edges": m.num_edges,
                "feature_dim": m.feature_dim,
                "average_degree": m.num_edges / max(m.num_nodes, 1),
            },  # fmt: skip
            "measured_on_graph": [
                "full_fetch_s",
                "graph_mb",
                "row_bytes",
                "exec_per_row_s",
                "exec_intercept_s (plus the base's)",
            ],  # fmt: skip
        },
    )

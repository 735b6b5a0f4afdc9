"""``gnn-faas bench fetch``: on-demand k-hop fetching against a full download.

FaaS-GNN (section 4.2) fetches each request's computation graph by byte ranges
instead of downloading the whole graph at cold start. Each query is ONE target
from the graph's request order (a seeded sample where it has none):
``KHopFetcher.fetch`` plus ``read_features`` of its input vertices, on a fetcher
that caches nothing, sharing one :class:`~gnn_faas.storage.ranges.ByteBudget` (at
most ``(1 + MAX_OVERREAD)`` x the needed bytes). Figures (summed or averaged over
queries):

- ``bytes_read``: what the backend transferred; ``bytes_min``: what the queries
  need, from the in-memory CSR (indptr entries, neighbour segments and feature rows
  of the expanded vertices: ``bytes_min_definition`` in the JSON); ``ratio``;
- ``ordering``: the stored graph's vertex order (``none`` when not renumbered);
- ``round_trips_per_hop``, ``feature_round_trips``: mean round trips;
- ``p50_ms``/``p99_ms``: per-query latency;
- ``full_download_bytes``/``full_download_ms``: every blob through a fresh
  backend, median of ``--repeats`` runs;
- ``requests_per_query``: storage requests per query as the range planner made
  them under the store's measured constants (``planner``);
- ``dollars_per_million_queries``: those requests at the store's request price
  (``storage_price``; null for a store not billed per request).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from gnn_faas.bench.store_proxy import store_access, store_fields
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.fetcher import FetchStats, KHopFetcher, sample_segments
from gnn_faas.storage.format import MANIFEST, GraphHandle, open_graph
from gnn_faas.storage.ranges import MAX_OVERREAD, ByteBudget
from gnn_faas.storage.resident import open_structure
from gnn_faas.traces.cost import load_prices, storage_price_for


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URI (file://, s3://, redis://)")
    p.add_argument(
        "--store-rtt-ms", type=float, default=0.0,
        help="round-trip time added to every store call (a TCP proxy; s3 and redis only)",
    )  # fmt: skip
    p.add_argument(
        "--structure-budget-mb", type=float, default=None,
        help="read the structure as the gateway does: resident when it fits this budget, "
        "else through a chunk cache of it (default: straight from the store, as a function)",
    )  # fmt: skip
    p.add_argument("--graph", required=True, help="graph name in the store")
    p.add_argument("--hops", type=int, default=2, help="layers of the computation graph")
    p.add_argument(
        "--fanout",
        default=None,
        help="per-hop fanouts, e.g. 25,10 (-1: all); default: full neighbourhoods",
    )
    p.add_argument("--queries", type=int, default=200, help="single-target queries")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (and query sample seed)")
    p.add_argument("--repeats", type=int, default=3, help="full downloads to take the median of")
    p.add_argument("--prices", default=None, help="price YAML (default: bundled)")


def parse_fanout(text: str | None, hops: int) -> list[int] | None:
    if text is None or text == "":
        return None
    try:
        fanouts = [int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidRequest(
            f"--fanout must be integers separated by commas, not {text!r}"
        ) from None
    if len(fanouts) != hops:
        raise InvalidRequest(f"--fanout needs one value per hop ({hops}), got {len(fanouts)}")
    return fanouts


def query_targets(graph: GraphHandle, queries: int, seed: int) -> tuple[np.ndarray, str]:
    """``queries`` single targets: the request order from its start (cycled if
    shorter), else a seeded uniform sample; and which of the two it is."""
    if graph.has("request_order") and graph.info("request_order").shape[0] > 0:
        order = graph.read_blob("request_order").astype(np.int64)
        return np.resize(order, queries), "request_order"
    rng = np.random.default_rng(seed)
    n = graph.num_nodes
    return rng.choice(n, size=queries, replace=queries > n), "sample"


def _segments(indptr: np.ndarray, indices: np.ndarray, v: np.ndarray):
    lo, hi = indptr[v], indptr[v + 1]
    counts = hi - lo
    offsets = np.cumsum(counts) - counts
    idx = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(lo - offsets, counts)
    return counts, indices[idx].astype(np.int64)


def min_bytes(
    indptr: np.ndarray,
    indices: np.ndarray,
    target: int,
    hops: int,
    fanouts: list[int] | None,
    seed: int,
    row_bytes: int,
) -> int:
    """Exact bytes one query needs, from the in-memory CSR (see the module docstring).

    Sampling follows the fetcher's definition (:func:`sample_segments`), so the
    same vertices are expanded; the byte accounting is independent of it.
    """
    known = np.array([target], dtype=np.int64)
    frontier = known
    expanded = []
    for hop in range(hops):
        if frontier.size == 0:
            break
        counts, nbrs = _segments(indptr, indices, frontier)
        expanded.append(frontier)
        fanout = None if fanouts is None else fanouts[hop]
        if fanout is not None and fanout >= 0:
            nbrs = nbrs[sample_segments(frontier, counts, fanout, seed)]
        frontier = np.setdiff1d(nbrs, known)
        known = np.union1d(known, frontier)
    exp = np.concatenate(expanded) if expanded else np.zeros(0, np.int64)
    indptr_entries = np.unique(np.concatenate((exp, exp + 1))).size
    segment_bytes = int((indptr[exp + 1] - indptr[exp]).sum()) * indices.itemsize
    return indptr_entries * 8 + segment_bytes + known.size * row_bytes


def full_download(uri: str, graph: GraphHandle, repeats: int) -> tuple[int, float]:
    """``(bytes, median ms)`` of reading the manifest and every blob whole, each
    time through a newly opened backend (a cold container)."""
    keys = [f"{graph.prefix}/{MANIFEST}"] + [graph.path(k) for k in graph.manifest.blobs]
    times, nbytes = [], 0
    for _ in range(max(1, repeats)):
        backend: StorageBackend = open_backend(uri)
        try:
            t0 = time.perf_counter()
            nbytes = sum(len(backend.cat_file(k)) for k in keys)
            times.append(time.perf_counter() - t0)
        finally:
            backend.close()
    return nbytes, float(np.median(times)) * 1e3


def run(args: argparse.Namespace) -> dict[str, Any]:
    rtt = getattr(args, "store_rtt_ms", 0.0)
    with store_access(args.store, rtt) as (uri, env, _), _environ(env):
        out = _run(argparse.Namespace(**{**vars(args), "store": uri}))
    return {**out, **store_fields(args.store, rtt)}


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process for the block (the proxy's S3 endpoint)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if args.queries <= 0:
        raise InvalidRequest("--queries must be positive")
    if args.hops < 1:
        raise InvalidRequest("--hops must be at least 1")
    fanouts = parse_fanout(args.fanout, args.hops)
    backend = open_backend(args.store)
    t0 = time.perf_counter()
    try:
        graph = open_graph(backend, args.graph)
    except NotFound as exc:
        raise NotFound(f"{exc}; run: gnn-faas datasets prepare {args.graph} --store ...") from None
    open_ms = (time.perf_counter() - t0) * 1e3
    targets, target_source = query_targets(graph, args.queries, args.seed)

    structure = None
    budget_mb = getattr(args, "structure_budget_mb", None)
    if budget_mb is not None:
        t0 = time.perf_counter()
        structure = open_structure(graph, int(budget_mb * 2**20))
        open_ms += (time.perf_counter() - t0) * 1e3
    fetcher = KHopFetcher(graph, structure=structure)
    latency = np.empty(targets.size)
    hop_trips = np.empty(targets.size)
    feat_trips = np.empty(targets.size)
    total = FetchStats()
    vertices = 0
    for i, t in enumerate(targets.tolist()):
        stats = FetchStats()
        t0 = time.perf_counter()
        budget = ByteBudget(MAX_OVERREAD)  # one per query: its hops and its rows
        cg = fetcher.fetch([t], args.hops, fanouts, seed=args.seed, stats=stats, budget=budget)
        fetcher.read_features(cg.input_nodes, stats=stats, budget=budget)
        latency[i] = time.perf_counter() - t0
        hop_trips[i] = sum(stats.hop_round_trips)
        feat_trips[i] = stats.reads.round_trips - hop_trips[i]
        vertices += int(cg.input_nodes.size)
        total.reads.add(stats.reads)
        total.edges_fetched += stats.edges_fetched

    # the reference needs the whole CSR: read it after the timed queries
    indptr = graph.read_blob("indptr")
    indices = graph.read_blob("indices")
    row_bytes = graph.info("features").row_bytes
    bytes_min = sum(
        min_bytes(indptr, indices, t, args.hops, fanouts, args.seed, row_bytes)
        for t in targets.tolist()
    )
    full_bytes, full_ms = full_download(args.store, graph, args.repeats)
    reads = total.reads
    requests_per_query = reads.ranges_requested / targets.size
    price = storage_price_for(load_prices(args.prices), backend.scheme)
    p50, p99 = (float(x) for x in np.percentile(latency * 1e3, [50, 99]))
    return {
        "graph": args.graph,
        "backend": backend.scheme,
        "hops": args.hops,
        "fanout": fanouts,
        "queries": int(targets.size),
        "targets": target_source,
        "bytes_read": reads.bytes_read,
        "bytes_needed": reads.bytes_needed,
        "bytes_min": int(bytes_min),
        "bytes_min_definition": (
            "per query: 8 x distinct indptr entries (v, v+1) of the expanded vertices"
            " + their neighbour segments + one feature row per input vertex"
        ),
        "ordering": graph.manifest.extra.get("reorder", "none"),
        "max_bytes_ratio": 1 + MAX_OVERREAD,
        "ratio": reads.bytes_read / bytes_min if bytes_min else None,
        "round_trips_per_hop": float(hop_trips.mean()) / args.hops,
        "feature_round_trips": float(feat_trips.mean()),
        "ranges_requested": reads.ranges_requested,
        "vertices_per_query": vertices / targets.size,
        "edges_per_query": total.edges_fetched / targets.size,
        "bytes_per_query": reads.bytes_read / targets.size,
        "p50_ms": p50,
        "p99_ms": p99,
        "mean_ms": float(latency.mean()) * 1e3,
        "open_ms": open_ms,
        "full_download_bytes": full_bytes,
        "full_download_ms": full_ms,
        "requests_per_query": requests_per_query,
        "dollars_per_million_queries": (
            price.request_cost(requests_per_query * 1e6) if price is not None else None
        ),
        "storage_price": price.name if price is not None else None,
        "planner": fetcher.reader.cost.to_dict(),
        "structure": None if structure is None else structure.figures(),
    }

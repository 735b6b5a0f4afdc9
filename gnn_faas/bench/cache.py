"""``gnn-faas bench cache``: the adaptive feature cache against a static top-degree cache.

Replays the first ``--requests`` requests of the graph's real request order
(``request_order.bin``, never cycled; ``--order time``; ``--order random`` shuffles the same requests, seeded, to remove the
temporal locality) one request at a time. A request of ``--batch`` targets
fetches its ``--hops``-hop computation graph with the real
:class:`~gnn_faas.storage.fetcher.KHopFetcher` and looks up the feature rows of
its input vertices (``D_0``) in:

- the adaptive :class:`~gnn_faas.functions.feature_cache.FeatureCache`
  (frequency with halving decay + degree prior, admission by value) holding at
  most ``cache_fraction * num_nodes`` rows, whose misses are read from the
  store (``--features read``; ``skip`` loads zero rows, for hit rates of long
  replays without the I/O);
- a static cache of the same number of rows holding the highest out-degree
  vertices (``degree.bin``), the usual baseline.

``hit rate = rows served from the cache / all row lookups``. Defaults: 2 hops
sampled with fanouts 10, 5 (FaaS-GNN serves 2-layer GCN/GAT on sampled
neighbourhoods; a full 2-hop neighbourhood of a Higgs hub has ~31k vertices,
more than a 10% cache holds, and ``--fanout full`` measures that case).

Output: ``adaptive_hit_rate``, ``static_hit_rate``, ``evictions``,
``admissions``, ``peak_memory_bytes`` (the adaptive cache's largest row
array), ``process_max_rss_bytes``, ``requests``, ``lookups``,
``unique_rows`` (``1 - unique_rows / lookups`` bounds any cache's hit
rate), ``cache_rows``, ``seconds`` and the settings.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="store URI")
    p.add_argument("--graph", required=True, help="graph name in the store")
    p.add_argument("--order", choices=("time", "random"), default="time", help="request order")
    p.add_argument(
        "--cache-fraction", type=float, default=0.1, help="cache rows / vertices (default 0.1)"
    )
    p.add_argument(
        "--requests",
        type=int,
        default=100000,
        help="requests to replay (default 100000, at most the order)",
    )
    p.add_argument("--batch", type=int, default=1, help="targets per request (default 1)")
    p.add_argument("--hops", type=int, default=2, help="layers of the model (default 2)")
    p.add_argument("--fanout", default="10,5", help="per-hop fanouts, or 'full' (default: 10,5)")
    p.add_argument("--seed", type=int, default=0, help="sampling and shuffle seed")
    p.add_argument(
        "--decay-every", type=int, default=None, help="cache policy: halve counts every N"
    )
    p.add_argument("--degree-weight", type=float, default=None, help="cache policy: degree prior")
    p.add_argument(
        "--features",
        choices=("read", "skip"),
        default="read",
        help="read missed rows from the store (default) or skip the reads",
    )


def parse_fanouts(text: str | None, hops: int) -> list[int] | None:
    from gnn_faas.errors import InvalidRequest

    if text is None or text in ("", "full"):
        return None
    try:
        fanouts = [int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidRequest(
            f"--fanout must be 'full' or integers like 10,5, not {text!r}"
        ) from None
    if len(fanouts) != hops:
        raise InvalidRequest(f"--fanout needs one value per hop ({hops}), got {len(fanouts)}")
    return fanouts


def run(args: argparse.Namespace) -> dict[str, Any]:
    import resource
    import time

    import numpy as np

    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.feature_cache import CachePolicy, FeatureCache
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.format import open_graph

    if not 0 < args.cache_fraction <= 1:
        raise InvalidRequest("--cache-fraction must be in (0, 1]")
    if args.requests < 1 or args.batch < 1 or args.hops < 1:
        raise InvalidRequest("--requests, --batch and --hops must be >= 1")
    fanouts = parse_fanouts(args.fanout, args.hops)
    graph = open_graph(args.store, args.graph)
    n = graph.num_nodes
    if not graph.has("request_order") or graph.info("request_order").shape[0] == 0:
        raise InvalidRequest(f"graph {graph.name!r} has no request order to replay")
    order = graph.read_blob("request_order").astype(np.int64)
    requests = min(args.requests, order.size // args.batch)  # the order once, never cycled
    order = order[: requests * args.batch]
    if args.order == "random":
        order = np.random.default_rng(args.seed).permutation(order)
    degree = graph.read_blob("degree").astype(np.int64)
    dim = int(np.prod(graph.info("features").shape[1:], dtype=np.int64))
    rows = max(1, int(args.cache_fraction * n))
    defaults = CachePolicy()
    policy = CachePolicy(
        decay_every=args.decay_every or defaults.decay_every,
        degree_weight=defaults.degree_weight if args.degree_weight is None else args.degree_weight,
        max_rows=rows,
    )
    fetcher = KHopFetcher(graph)
    if args.features == "read":
        loader = fetcher.read_features
    else:

        def loader(ids: np.ndarray) -> np.ndarray:
            return np.zeros((ids.size, dim), dtype=np.float32)

    adaptive = FeatureCache(n, dim, degree=degree, policy=policy)
    static = np.zeros(n, dtype=bool)
    static[np.argsort(-degree, kind="stable")[:rows]] = True
    seen = np.zeros(n, dtype=bool)
    static_hits = lookups = peak = 0
    t0 = time.perf_counter()
    for i in range(requests):
        targets = order[i * args.batch : (i + 1) * args.batch]
        cg = fetcher.fetch(targets, args.hops, fanouts=fanouts, seed=args.seed)
        ids = cg.input_nodes
        adaptive.get_rows(ids, loader)
        static_hits += int(np.count_nonzero(static[ids]))
        lookups += int(ids.size)
        seen[ids] = True
        peak = max(peak, adaptive.bytes)
    seconds = time.perf_counter() - t0
    figures = adaptive.as_dict()
    return {
        "graph": graph.name,
        "order": args.order,
        "requests": requests,
        "batch": args.batch,
        "hops": args.hops,
        "fanouts": fanouts,
        "cache_fraction": args.cache_fraction,
        "cache_rows": rows,
        "decay_every": policy.decay_every,
        "degree_weight": policy.degree_weight,
        "features": args.features,
        "lookups": lookups,
        "unique_rows": int(np.count_nonzero(seen)),
        "adaptive_hit_rate": figures["hit_rate"],
        "static_hit_rate": static_hits / lookups if lookups else 0.0,
        "evictions": figures["evictions"],
        "admissions": figures["admissions"],
        "peak_memory_bytes": int(peak),
        "process_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": seconds,
    }

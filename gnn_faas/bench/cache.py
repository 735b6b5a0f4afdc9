"""``gnn-faas bench cache``: the adaptive feature cache against a static top-degree cache.

Replays the first ``--requests`` requests of the graph's request order (``--order
time``, or ``random``: the same requests shuffled, seeded) one at a time: each
fetches its ``--hops``-hop computation graph with the real
:class:`~gnn_faas.storage.fetcher.KHopFetcher` and looks up its input rows in the
adaptive :class:`~gnn_faas.functions.feature_cache.FeatureCache` (at most
``cache_fraction * num_nodes`` rows; misses read from the store unless ``--features
skip``) and in a static cache of as many top out-degree rows.

``--prior degree,fap`` runs once per prior on the same requests: ``fap`` ranks by
Quiver's feature access probability, computed from the first ``--fap-history``
share of the request order and scored on the requests after it (``--fap-refresh
N`` recomputes it every ``N`` requests); ``--warm`` fills each adaptive cache with
its prior's top rows first.

``hit rate = rows served from the cache / all row lookups``. Output:
``adaptive_hit_rate``, ``static_hit_rate``, ``evictions``, ``admissions``,
``peak_memory_bytes``, ``process_max_rss_bytes``, ``requests``, ``lookups``,
``unique_rows`` (``1 - unique_rows / lookups`` bounds any cache's hit rate),
``cache_rows``, ``seconds`` and the settings. The protocol and its defaults:
docs/design/bench-cache.md.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.feature_cache import CachePolicy, FeatureCache
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.workload_metrics import (
    DEFAULT_HALF_LIFE,
    DEFAULT_UNIFORM_MIX,
    fap,
    request_distribution,
)


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
        "--prior",
        default="degree",
        help="cache priors to compare, comma-separated: degree, fap (default: degree)",
    )
    p.add_argument(
        "--fap-history",
        type=float,
        default=0.5,
        help="share of the request order FAP is computed from (with --prior fap; default 0.5)",
    )
    p.add_argument(
        "--fap-refresh",
        type=int,
        default=0,
        help="recompute FAP every N replayed requests from all requests so far (0: never)",
    )
    p.add_argument(
        "--warm",
        action="store_true",
        help="start each adaptive cache filled with its prior's top rows",
    )
    p.add_argument(
        "--features",
        choices=("read", "skip"),
        default="read",
        help="read missed rows from the store (default) or skip the reads",
    )


def parse_fanouts(text: str | None, hops: int) -> list[int] | None:
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


def check_arguments(args: argparse.Namespace) -> list[str]:
    """The priors to compare; a clear error for any argument out of range."""
    if not 0 < args.cache_fraction <= 1:
        raise InvalidRequest("--cache-fraction must be in (0, 1]")
    if args.requests < 1 or args.batch < 1 or args.hops < 1:
        raise InvalidRequest("--requests, --batch and --hops must be >= 1")
    priors = [x.strip() for x in str(args.prior).split(",") if x.strip()]
    if not priors or any(p not in ("degree", "fap") for p in priors):
        raise InvalidRequest(f"--prior must list degree and/or fap, not {args.prior!r}")
    if not 0 < args.fap_history < 1:
        raise InvalidRequest("--fap-history must lie in (0, 1)")
    return priors


def replayed_order(
    args: argparse.Namespace, graph: Any, priors: list[str]
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(FAP history, replayed targets, requests)``: with ``fap`` the first
    ``--fap-history`` of the request order is history, never replayed; the rest
    is replayed once, never cycled (``--order random``: shuffled)."""
    if not graph.has("request_order") or graph.info("request_order").shape[0] == 0:
        raise InvalidRequest(f"graph {graph.name!r} has no request order to replay")
    order = graph.read_blob("request_order").astype(np.int64)
    skip = int(args.fap_history * order.size) if "fap" in priors else 0
    history, order = order[:skip], order[skip:]
    requests = min(args.requests, order.size // args.batch)
    order = order[: requests * args.batch]
    if requests < 1:
        raise InvalidRequest("no request left to replay after the FAP history")
    if args.order == "random":
        order = np.random.default_rng(args.seed).permutation(order)
    return history, order, requests


def fap_prior(
    args: argparse.Namespace, graph: Any, fanouts: list[int] | None, history: np.ndarray,
    order: np.ndarray,
) -> tuple[np.ndarray, Callable[[int], np.ndarray] | None, float]:  # fmt: skip
    """``(FAP from the history, refresh(i) or None, seconds to compute it)``;
    ``refresh(i)``: FAP after the first ``i`` replayed requests too."""
    indptr, indices = graph.read_blob("indptr"), graph.read_blob("indices")
    hop_fanouts = fanouts if fanouts is not None else [-1] * args.hops

    def fap_of(seen: np.ndarray) -> np.ndarray:
        r = request_distribution(
            graph.num_nodes, "request_order", seen, DEFAULT_HALF_LIFE, DEFAULT_UNIFORM_MIX
        )
        return fap(indptr, indices, hop_fanouts, r)

    t0 = time.perf_counter()
    score = fap_of(history)
    seconds = time.perf_counter() - t0
    if args.fap_refresh <= 0:
        return score, None, seconds

    def refresh(i: int) -> np.ndarray:
        return fap_of(np.concatenate((history, order[: i * args.batch])))

    return score, refresh, seconds


def run(args: argparse.Namespace) -> dict[str, Any]:
    priors = check_arguments(args)
    fanouts = parse_fanouts(args.fanout, args.hops)
    graph = open_graph(args.store, args.graph)
    n = graph.num_nodes
    history, order, requests = replayed_order(args, graph, priors)
    skip = history.size
    scores = {"degree": graph.read_blob("degree").astype(np.float64)}
    refresh = None
    t_fap = 0.0
    if "fap" in priors:
        scores["fap"], refresh, t_fap = fap_prior(args, graph, fanouts, history, order)

    rows = max(1, int(args.cache_fraction * n))
    fetcher = KHopFetcher(graph)
    # the requests' input vertices, fetched once for every prior
    t0 = time.perf_counter()
    lookups_by_request = []
    for i in range(requests):
        targets = order[i * args.batch : (i + 1) * args.batch]
        lookups_by_request.append(
            fetcher.fetch(targets, args.hops, fanouts=fanouts, seed=args.seed).input_nodes
        )
    fetch_seconds = time.perf_counter() - t0
    results = {
        p: replay_prior(
            args,
            graph,
            fetcher,
            lookups_by_request,
            p,
            scores[p],
            rows,
            refresh if p == "fap" else None,
        )
        for p in priors
    }
    main = results[priors[0]]
    lookups = main["lookups"]
    seen = np.zeros(n, dtype=bool)
    for ids in lookups_by_request:
        seen[ids] = True
    return {
        "graph": graph.name,
        "order": args.order,
        "requests": requests,
        "skipped_requests": skip,
        "batch": args.batch,
        "hops": args.hops,
        "fanouts": fanouts,
        "cache_fraction": args.cache_fraction,
        "cache_rows": rows,
        "decay_every": main["decay_every"],
        "degree_weight": main["degree_weight"],
        "features": args.features,
        "warm": bool(args.warm),
        "fap_refresh": args.fap_refresh,
        "lookups": lookups,
        "unique_rows": int(np.count_nonzero(seen)),
        "adaptive_hit_rate": main["adaptive_hit_rate"],
        "static_hit_rate": main["static_hit_rate"],
        "evictions": main["evictions"],
        "admissions": main["admissions"],
        "peak_memory_bytes": main["peak_memory_bytes"],
        "process_max_rss_bytes": main["process_max_rss_bytes"],
        "hit_rates": {
            p: {k: results[p][k] for k in ("adaptive_hit_rate", "static_hit_rate", "warmed_rows")}
            for p in priors
        },
        "fap_seconds": t_fap,
        "fetch_seconds": fetch_seconds,
        "seconds": sum(r["seconds"] for r in results.values()) + fetch_seconds + t_fap,
    }


def replay_prior(
    args, graph, fetcher, lookups_by_request, prior: str, score, rows: int, refresh=None
) -> dict:
    """One prior's replay: the adaptive cache and the static top-``score`` cache."""
    n = graph.num_nodes
    dim = int(np.prod(graph.info("features").shape[1:], dtype=np.int64))
    defaults = CachePolicy()
    policy = CachePolicy(
        decay_every=args.decay_every or defaults.decay_every,
        degree_weight=defaults.degree_weight if args.degree_weight is None else args.degree_weight,
        max_rows=rows,
    )
    if args.features == "read":
        loader = fetcher.read_features
    else:

        def loader(ids: np.ndarray) -> np.ndarray:
            return np.zeros((ids.size, dim), dtype=np.float32)

    ranked = np.argsort(-score, kind="stable")[:rows]
    if prior == "degree":
        adaptive = FeatureCache(n, dim, degree=score, policy=policy)
    else:  # the top-k FAP only, as a memory function keeps it
        adaptive = FeatureCache(n, dim, policy=policy, prior=(ranked, score[ranked]))
    warmed = adaptive.warm(ranked, loader) if args.warm else 0
    static = np.zeros(n, dtype=bool)
    static[ranked] = True
    static_hits = lookups = peak = 0
    t0 = time.perf_counter()
    for i, ids in enumerate(lookups_by_request):
        if refresh is not None and i and i % args.fap_refresh == 0:
            fresh = refresh(i)
            ranked = np.argsort(-fresh, kind="stable")[:rows]
            adaptive.set_prior((ranked, fresh[ranked]))
            static[:] = False
            static[ranked] = True
        adaptive.get_rows(ids, loader)
        static_hits += int(np.count_nonzero(static[ids]))
        lookups += int(ids.size)
        peak = max(peak, adaptive.bytes)
    figures = adaptive.as_dict()
    return {
        "decay_every": policy.decay_every,
        "degree_weight": policy.degree_weight,
        "lookups": lookups,
        "adaptive_hit_rate": figures["hit_rate"],
        "static_hit_rate": static_hits / lookups if lookups else 0.0,
        "warmed_rows": warmed,
        "evictions": figures["evictions"],
        "admissions": figures["admissions"],
        "peak_memory_bytes": int(peak),
        "process_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": time.perf_counter() - t0,
    }

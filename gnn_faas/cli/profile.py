"""``gnn-faas profile memory``: record memory-function request profiles and fit
the peak-memory predictor the feature cache sizes itself with.

    gnn-faas profile memory --store URI --graph NAME --requests N --out FILE.json

Requests follow the graph's real request order in batches of 1..64 targets
with 1..3 hops (see :mod:`gnn_faas.functions.profiler`); the held-out median
relative error is printed in a one-line JSON summary and stored in the file's
``meta``. Serve the result with ``gnn-faas serve memory --predictor FILE.json``.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="profile function requests and fit predictors")
    kinds = p.add_subparsers(dest="profile_kind", metavar="KIND", required=True)
    m = kinds.add_parser("memory", help="fit the memory function's peak-memory predictor")
    m.add_argument("--store", required=True, help="graph store URI")
    m.add_argument("--graph", required=True, help="graph name in the store")
    m.add_argument("--requests", type=int, default=300, help="requests to profile (default 300)")
    m.add_argument("--out", required=True, help="predictor JSON to write")
    m.add_argument("--seed", type=int, default=0, help="seed (batches, hops, sampling)")
    m.add_argument("--max-hops", type=int, default=3, help="hops drawn from 1..N (default 3)")
    m.add_argument("--max-batch", type=int, default=64, help="targets drawn from 1..N (default 64)")
    m.add_argument(
        "--test-fraction", type=float, default=0.25, help="requests held out for the error report"
    )
    m.set_defaults(handler=_profile_memory)


def _profile_memory(args: argparse.Namespace) -> int:
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.profiler import profile_and_fit
    from gnn_faas.storage.format import open_graph

    if not 0 < args.test_fraction < 1:
        raise InvalidRequest("--test-fraction must be in (0, 1)")
    if args.max_hops < 1 or args.max_batch < 1:
        raise InvalidRequest("--max-hops and --max-batch must be >= 1")
    graph = open_graph(args.store, args.graph)
    predictor, report = profile_and_fit(
        graph,
        requests=args.requests,
        seed=args.seed,
        test_fraction=args.test_fraction,
        max_batch=args.max_batch,
        max_hops=args.max_hops,
    )
    try:
        predictor.save(args.out)
    except OSError as exc:
        raise InvalidRequest(f"cannot write {args.out}: {exc.strerror}") from None
    json.dump({**report, "out": args.out}, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0

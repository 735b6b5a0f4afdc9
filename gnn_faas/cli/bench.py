"""``gnn-faas bench KIND ...``: benchmarks that print one JSON object.

Each benchmark is a module ``gnn_faas.bench.KIND`` (``-`` in KIND read as ``_``) exposing
``add_arguments(parser)`` and ``run(args) -> dict``. The module is imported
only when its benchmark runs (its arguments are parsed then), so building the
``gnn-faas`` parser, which every function instance does at start-up, stays
free of numpy, scipy and torch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

BENCHMARKS = {
    "fetch": "on-demand k-hop fetch against a full download (FaaS-GNN 4.2)",
    "cache": "adaptive feature cache against a static top-degree cache (FaaS-GNN 4.3)",
    "coldstart": "function instances from process start to ready, and their memory",
    "e2e": "end to end over the Twitter trace: gnn_faas vs request-centric vs no sharing",
    "srpe": "precomputed embeddings with selective recomputation vs exact serving (OMEGA)",
    "overload": "stepped open-loop load: honest SLO counts, shedding, RSS per step",
    "outage": "a store that hangs under load: liveness, deadlines, 503s naming the store, recovery",
    "soak": "steady open-loop load for minutes: RSS slope per process after warm-up",
    "live-vs-sim": "one trace window live and simulated: p50, p99, GB-s, sharing and ratios",
    "slowclients": "idle and slow-body connections held against a gateway; RSS after big bodies",
    "storage-constants": "what a request and a byte cost on a store (the range planner's model)",
    "updates": "a graph changing while served: ingest rate, ack, freshness, p99, PyG, compaction",
    "update-faults": "writers and compactions SIGKILLed mid-flight, two racing writers: nothing lost",
}


def register(sub: argparse._SubParsersAction) -> None:
    kinds = "\n".join(f"  {k:<17} {v}" for k, v in BENCHMARKS.items())
    p = sub.add_parser(
        "bench",
        help="run a benchmark and print JSON",
        description=f"benchmarks:\n{kinds}\n\n`gnn-faas bench KIND --help` for a benchmark's options",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("bench", metavar="KIND", choices=sorted(BENCHMARKS))
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler=_run)


def bench_parser(kind: str) -> tuple[object, argparse.ArgumentParser]:
    """The benchmark's module and its argument parser (imports the module)."""
    module = importlib.import_module(f"gnn_faas.bench.{kind.replace('-', '_')}")
    bp = argparse.ArgumentParser(prog=f"gnn-faas bench {kind}", description=BENCHMARKS[kind])
    module.add_arguments(bp)
    bp.add_argument("--json", action="store_true", help="print compact JSON (default: indented)")
    return module, bp


def parse_bench_args(kind: str, argv: list[str]) -> tuple[object, argparse.Namespace]:
    module, bp = bench_parser(kind)
    return module, bp.parse_args(argv)


def _run(args: argparse.Namespace) -> int:
    module, bargs = parse_bench_args(args.bench, args.bench_args)
    result = module.run(bargs)
    json.dump(result, sys.stdout, indent=None if bargs.json else 2, sort_keys=True)
    sys.stdout.write("\n")
    return 0

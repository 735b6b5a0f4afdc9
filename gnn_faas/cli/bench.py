"""``gnn-faas bench KIND ...``: benchmarks that print one JSON object.

Each benchmark is a module ``gnn_faas.bench.KIND`` exposing
``add_arguments(parser)`` and ``run(args) -> dict``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

BENCHMARKS = {
    "fetch": "on-demand k-hop fetch against a full download (FaaS-GNN 4.2)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print JSON")
    kinds = p.add_subparsers(dest="bench", metavar="KIND", required=True)
    for kind, help_text in BENCHMARKS.items():
        module = importlib.import_module(f"gnn_faas.bench.{kind}")
        bp = kinds.add_parser(kind, help=help_text)
        module.add_arguments(bp)
        bp.add_argument("--json", action="store_true", help="print compact JSON (default: indented)")
        bp.set_defaults(handler=_run, bench_module=module)


def _run(args: argparse.Namespace) -> int:
    result = args.bench_module.run(args)
    json.dump(result, sys.stdout, indent=None if args.json else 2, sort_keys=True)
    sys.stdout.write("\n")
    return 0

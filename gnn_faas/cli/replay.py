"""``gnn-faas replay TRACE --url URL --model M``: replay a trace live, open loop.

    gnn-faas replay azure2019 --url http://127.0.0.1:8080 --model bitcoin-otc \\
        --minutes 5 --out var/replay --predict
    gnn-faas replay twitter --updates bitcoin-otc-time --update-rate 20 --token T ...

Writes a run directory (``requests.csv``, ``timeline.csv``, ``summary.json``,
PNG plots); see :mod:`gnn_faas.traces.live`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from gnn_faas.traces.sources import TRACES, add_trace_arguments, add_update_arguments

    p = sub.add_parser("replay", help="replay a request trace live against a gateway")
    p.add_argument("trace", metavar="TRACE", choices=TRACES, help=" | ".join(TRACES))
    p.add_argument("--url", default="http://127.0.0.1:8080", help="gateway URL")
    p.add_argument("--model", default="bitcoin-otc", help="served model name")
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--out", default=None, help="run directory to write")
    p.add_argument("--senders", type=int, default=64, help="bounded sender pool size")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    p.add_argument("--slo", type=float, default=None, help="SLO (default: the model's)")
    p.add_argument("--predict", action="store_true", help="simulate the same window beside it")
    p.add_argument("--policies", default="all", help="policies simulated with --predict")
    p.add_argument("--calibration", default=None, help="calibration JSON (default: bundled)")
    p.add_argument(
        "--fit-warmup",
        action="store_true",
        help="with --predict and --warmup: refit the profile's execution times "
        "on the warm-up's executions before predicting the window",
    )
    p.add_argument("--prices", default=None, help="price YAML (default: bundled)")
    p.add_argument("--json", action="store_true", help="compact JSON on stdout")
    p.add_argument("--no-progress", action="store_true")
    add_update_arguments(
        p, "send this stream of graph updates beside the requests (POST "
        "/v2/graphs/{graph}/updates over the measured window); the summary's updates: acks, "
        "ack latency, versions", token=True,
    )  # fmt: skip
    add_trace_arguments(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.traces.live import run_replay

    if args.senders < 1 or args.timeout <= 0:
        raise InvalidRequest("--senders must be >= 1 and --timeout positive")
    if args.fit_warmup and not (args.predict and args.warmup > 0):
        raise InvalidRequest("--fit-warmup needs --predict and a --warmup")
    if args.updates and not (args.token or os.environ.get("GNN_FAAS_WRITE_TOKEN")):
        raise InvalidRequest("--updates needs a write token: --token or GNN_FAAS_WRITE_TOKEN")
    summary = run_replay(args.trace, args)
    json.dump(summary, sys.stdout, indent=None if args.json else 2, sort_keys=True)
    sys.stdout.write("\n")
    return 0

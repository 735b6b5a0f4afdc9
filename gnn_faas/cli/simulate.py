"""``gnn-faas simulate TRACE``: a trace under every serving policy, simulated.

    gnn-faas simulate twitter --day --graph bitcoin-otc --policies all --json
    gnn-faas simulate twitter --days 7 --json                  # a week: the day played 7 times
    gnn-faas simulate azure2019 --minutes 60 --out var/sim     # + CSV, JSON and plots
    gnn-faas simulate twitter --updates bitcoin-otc-time --update-rate 5 --json  # + updates
    gnn-faas simulate calibrate --graph bitcoin-otc --out FILE  # measure a profile
    gnn-faas simulate calibrate-graph --graph NAME --store URI --out FILE  # its graph figures
    gnn-faas simulate study                                     # the tables of docs/studies.md

Service times, cold starts and memory come from a calibration profile measured
on the real system (``--calibration``, default the one bundled for the graph;
see :mod:`gnn_faas.traces.calibration`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from gnn_faas.gateway.work_conserving import OBJECTIVES

COMMANDS = ("azure2019", "azure2021", "twitter", "calibrate", "calibrate-graph", "study")


def register(sub: argparse._SubParsersAction) -> None:
    from gnn_faas.traces.sources import add_trace_arguments, add_update_arguments

    p = sub.add_parser("simulate", help="simulate a trace under every serving policy")
    p.add_argument("trace", metavar="TRACE", choices=COMMANDS, help=" | ".join(COMMANDS))
    p.add_argument("--graph", default="bitcoin-otc")
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--policies", default="all", help="comma-separated policies, or 'all'")
    p.add_argument("--calibration", default=None, help="calibration JSON (default: bundled)")
    p.add_argument("--prices", default=None, help="price YAML (default: bundled)")
    p.add_argument("--slo", type=float, default=None, help="SLO seconds (default: calibration's)")
    p.add_argument("--out", default=None,
                   help="run directory: summary.json, per-second timeline_<policy>.csv, every "
                        "request's record in requests_<policy>.npy (streamed), plots "
                        "(calibrate: the JSON file)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--fanouts", default=None,
                   help="per-hop sampled fanouts, e.g. 10,10 (as the serving config's fanouts); "
                        "calibrate-graph measures with them, a simulation defaults to the "
                        "calibration's (full neighbourhoods without)")  # fmt: skip
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds a request may take before the platform drops it (default 30, "
                        "the gateway's request_timeout_s; Knative's revision default is 300, "
                        "AWS API Gateway's 29)")  # fmt: skip
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                   help="processes running policies (and --frontier points) side by side; "
                        "the figures do not depend on it (default: CPUs, at most 4)")  # fmt: skip
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=None,
        help="gnn_faas's buffer objective (default: the buffers section's, balanced)",
    )
    p.add_argument(
        "--latency-slack",
        type=float,
        default=None,
        help="balanced: mean latency within (1 + slack) x no sharing's (default 0.1)",
    )
    p.add_argument("--frontier", action="store_true",
                   help="sweep gnn_faas's objective (cost ... latency) beside the baselines: "
                        "JSON points, and a PNG under --out")  # fmt: skip
    add_update_arguments(
        p, "a stream of graph updates beside the requests: each policy's summary gets what the "
        "updates cost (store requests, invalidations, compactions, GB-s, dollars)",
    )  # fmt: skip
    c = p.add_argument_group("calibrate")
    c.add_argument("--memory-mb", type=int, default=256)
    c.add_argument("--compute-mb", type=int, default=512)
    c.add_argument("--max-instances", type=int, default=4)
    add_trace_arguments(p)
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gnn_faas.cli.train import parse_fanouts
    from gnn_faas.errors import InvalidRequest

    args.fanouts = parse_fanouts(args.fanouts)
    if not args.request_timeout > 0:
        raise InvalidRequest("--request-timeout must be positive")
    if args.workers < 1:
        raise InvalidRequest("--workers must be at least 1")
    if args.trace == "calibrate":
        from gnn_faas.traces.measure_calibration import calibrate

        if not args.out:
            raise InvalidRequest("simulate calibrate needs --out FILE.json")
        cal = calibrate(
            graph=args.graph,
            store=args.store or "",
            memory_mb=args.memory_mb,
            compute_mb=args.compute_mb,
            max_instances=args.max_instances,
            log=lambda m: print(m, file=sys.stderr),
        )
        cal.save(args.out)
        print(json.dumps({k: v for k, v in cal.to_dict().items() if k != "samples"}))
        return 0
    if args.trace == "calibrate-graph":
        from gnn_faas.traces.calibration import Calibration
        from gnn_faas.traces.graph_calibration import calibrate_graph
        from gnn_faas.traces.run import open_prepared_graph

        if not args.out:
            raise InvalidRequest("simulate calibrate-graph needs --out FILE.json")
        base = (
            Calibration.load(args.calibration)
            if args.calibration
            else Calibration.bundled("bitcoin-otc")
        )
        graph, store = open_prepared_graph(args.graph, args.store)
        cal = calibrate_graph(base, graph, store, max_instances=args.max_instances,
                              fanouts=args.fanouts,
                              log=lambda m: print(m, file=sys.stderr))  # fmt: skip
        cal.save(args.out)
        print(json.dumps({k: v for k, v in cal.to_dict().items() if k != "samples"}))
        return 0
    if args.trace == "study":
        from gnn_faas.traces.study import run_study

        print(run_study(args))
        return 0
    from gnn_faas.traces.run import simulate_frontier, simulate_trace

    if args.frontier and args.updates:
        raise InvalidRequest(
            "--updates is not available with --frontier (its points carry no costs)"
        )
    if args.frontier:
        json.dump(simulate_frontier(args.trace, args), sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    result = simulate_trace(args.trace, args)
    if args.json:
        json.dump(result, sys.stdout, sort_keys=True)
        sys.stdout.write("\n")
    else:
        from gnn_faas.traces.report import policy_table

        print(policy_table(result))
    return 0

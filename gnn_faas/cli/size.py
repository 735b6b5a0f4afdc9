"""``gnn-faas size``: choose function cores from profiled latencies (λGrapher 3.5).

Profiles the real stages of a model on a real batch of requests on this
machine (:mod:`gnn_faas.scheduler.sizing.stage_profile`: each layer's Aggregate
and Update timed with 1 and 2 threads, Amdahl's law over the 0.25-vCPU grid,
memory from the formulas), then chooses cores with ``bayes_opt`` under
``Σ T <= SLO − timeout``, next to the exhaustive optimum for comparison.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("size", help="choose function cores with Bayesian optimisation")
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--graph", default="bitcoin-otc")
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--targets", type=int, default=16, help="requests in the profiled batch")
    p.add_argument("--fanouts", default=None,
                   help="per-hop sampled fanouts of the profiled batch, as the serving config's "
                        "fanouts, e.g. 10,10 (-1: every neighbour; default: the checkpoint's)")  # fmt: skip
    p.add_argument("--slo", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=0.15, help="buffer wait budget (s)")
    p.add_argument("--max-cores", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile-out", default=None, help="save the latency profile JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_size)


def _size(args: argparse.Namespace) -> int:
    import numpy as np

    from gnn_faas.cli.train import parse_fanouts
    from gnn_faas.config import ServingConfig
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.checkpoint import load_config
    from gnn_faas.scheduler.sizing.chart import serving_sizes
    from gnn_faas.scheduler.sizing.function_sizing import (
        exhaustive,
        size_functions,
        stages_from_profile,
    )
    from gnn_faas.scheduler.sizing.stage_profile import profile_stages
    from gnn_faas.storage.format import open_graph

    if args.targets < 1 or args.repeats < 1 or args.timeout >= args.slo:
        raise InvalidRequest("need --targets >= 1, --repeats >= 1 and --timeout < --slo")
    store = args.store or ServingConfig().store
    graph = open_graph(store, args.graph)
    order = graph.read_blob("request_order") if graph.has("request_order") else None
    targets = order[: args.targets] if order is not None else np.arange(args.targets)
    fanouts = parse_fanouts(args.fanouts)
    found = profile_stages(graph, args.model, targets, args.repeats, args.max_cores, fanouts)
    if args.profile_out:
        found.profile.save(args.profile_out)
    stages = stages_from_profile(found.profile, found.rows, found.memory_mb)
    bo = size_functions(stages, args.slo, args.timeout, max_cores=args.max_cores, seed=args.seed)
    ex = exhaustive(stages, args.slo, args.timeout, max_cores=args.max_cores)
    out = {
        "graph": args.graph,
        "batch_targets": int(targets.size),
        "layer_sizes": list(found.cg.layer_sizes),
        "memory_mb": found.memory_mb,
        "bayes_opt": bo.as_dict(),
        "exhaustive": ex.as_dict(),
        "cost_ratio": bo.cost / ex.cost if ex.cost else None,
    }
    # the model keys of a serving config (gnn-faas up --config) for these sizes
    used = fanouts if fanouts is not None else load_config(args.model).fanouts
    out["serving"] = {**serving_sizes(out), "fanouts": None if used is None else list(used)}
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0

"""``gnn-faas size``: choose function cores from profiled latencies (λGrapher 3.5).

Profiles the real stages of a model on a real batch of requests on this
machine: each layer's Aggregate (numpy, the memory function's work) and Update
(torch, the compute function's), timed with 1 and 2 threads. Those two points
fix each stage's serial fraction ``s`` (Amdahl: ``T(c) = T(1)·(s + (1 − s)/c)``
for ``c >= 1``); below one core a CPU quota stretches time as ``T(1)/c``. The
profile covers the 0.25-vCPU grid, the memory of each stage comes from the
memory formulas, and cores are chosen with ``bayes_opt`` under
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
    p.add_argument("--slo", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=0.15, help="buffer wait budget (s)")
    p.add_argument("--max-cores", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile-out", default=None, help="save the latency profile JSON here")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_size)


def _time(fn, repeats: int) -> float:
    import time

    import numpy as np

    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _size(args: argparse.Namespace) -> int:
    import numpy as np
    import torch
    from threadpoolctl import threadpool_limits

    from gnn_faas.config import ServingConfig
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.aggregate import aggregate
    from gnn_faas.functions.checkpoint import load_config
    from gnn_faas.functions.layer_plan import ModelPlan
    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.scheduler.sizing.function_memory import (
        COMPUTE_RUNTIME_MB,
        MEMORY_RUNTIME_MB,
        MIB,
        compute_function_bytes,
        memory_function_bytes,
        round_memory_mb,
        update_activation_row_bytes,
    )
    from gnn_faas.scheduler.sizing.function_sizing import (
        core_grid,
        exhaustive,
        size_functions,
        stages_from_profile,
    )
    from gnn_faas.scheduler.sizing.latency_profile import LatencyProfile
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.format import open_graph

    if args.targets < 1 or args.repeats < 1 or args.timeout >= args.slo:
        raise InvalidRequest("need --targets >= 1, --repeats >= 1 and --timeout < --slo")
    store = args.store or ServingConfig().store
    graph = open_graph(store, args.graph)
    cfg = load_config(args.model)
    plan = ModelPlan.from_config(cfg)
    update = UpdateModel.load(args.model, device="cpu")
    fetcher = KHopFetcher(graph)
    order = graph.read_blob("request_order") if graph.has("request_order") else None
    targets = order[: args.targets] if order is not None else np.arange(args.targets)
    cg = fetcher.fetch(targets, cfg.num_layers, fanouts=cfg.fanouts, degrees=True)

    profile = LatencyProfile()
    rows: dict[str, int] = {}
    memory_mb: dict[str, int] = {}
    weight_bytes = sum(t.numel() * 4 for t in update.w.values())
    h = fetcher.read_features(cg.input_nodes)
    grid = core_grid(args.max_cores)
    for step in plan.steps:
        block = cg.block(step.layer)
        x = h[: block.num_src]
        if step.pre:
            x = update.pre(step.layer, x)["h"]
        extras = {}
        if step.needs_degrees:
            extras = {
                "deg_src": cg.in_degree[: block.num_src],
                "deg_dst": cg.in_degree[: block.num_dst],
            }
        if step.needs_alpha:
            pre = update.pre(step.layer, h[: block.num_src])
            x, extras = pre["h"], {"alpha_src": pre["alpha_src"], "alpha_dst": pre["alpha_dst"]}

        def agg(block=block, x=x, extras=extras, step=step):
            return aggregate(step.op, block, x, eps=step.eps, **extras)

        agg_out = agg()
        root = x[: block.num_dst] if step.return_root else None

        def upd(agg_out=agg_out, root=root, step=step):
            return update.post(step.layer, agg_out, root)

        timings = {}
        for threads in (1, 2):
            with threadpool_limits(threads):
                timings[("aggregate", threads)] = _time(agg, args.repeats)
            torch.set_num_threads(threads)
            timings[("update", threads)] = _time(upd, args.repeats)
        for kind in ("aggregate", "update"):
            name = f"{kind}-{step.layer}"
            t1, t2 = timings[(kind, 1)], timings[(kind, 2)]
            serial = float(np.clip(2 * t2 / t1 - 1, 0.0, 1.0))
            n = block.num_dst
            for c in grid:
                t = t1 / c if c < 1 else t1 * (serial + (1 - serial) / c)
                profile.add(name, float(c), n, t)
            rows[name] = n
            if kind == "aggregate":
                need = memory_function_bytes(
                    block.num_src, block.num_edges, n, step.src_dim * 4, step.agg_dim * 4,
                    MEMORY_RUNTIME_MB * MIB,
                )  # fmt: skip
            else:
                act = update_activation_row_bytes(step.agg_dim, step.out_dim)
                need = compute_function_bytes(weight_bytes, n, act, COMPUTE_RUNTIME_MB * MIB)
            memory_mb[name] = round_memory_mb(int(need))
        h = update.post(step.layer, agg_out, root)  # next layer's input rows
    if args.profile_out:
        profile.save(args.profile_out)
    stages = stages_from_profile(profile, rows, memory_mb)
    bo = size_functions(stages, args.slo, args.timeout, max_cores=args.max_cores, seed=args.seed)
    ex = exhaustive(stages, args.slo, args.timeout, max_cores=args.max_cores)
    out = {
        "graph": args.graph,
        "batch_targets": int(targets.size),
        "layer_sizes": list(cg.layer_sizes),
        "memory_mb": memory_mb,
        "bayes_opt": bo.as_dict(),
        "exhaustive": ex.as_dict(),
        "cost_ratio": bo.cost / ex.cost if ex.cost else None,
    }
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0

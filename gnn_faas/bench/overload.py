"""``gnn-faas bench overload``: stepped open-loop load through a real stack.

A ``gnn-faas up`` stack (graph sharing, local platform) gets Poisson arrivals
at each rate of ``--rates`` for ``--step-seconds`` (an open loop: requests go
out on time whatever the gateway does). Per step:

- client side: p50/p99 of the answered (200) requests, the requests answered
  after the SLO (``slo_violations``), the requests shed (503 + Retry-After);
- gateway side: the change of its own totals over the step (``/v1/status``:
  ``slo_violations``, ``shed``, ``requests``), read after the last answer of
  the step came back;
- ``slo_count_diff``: gateway minus client SLO count, and whether it is within
  1% of the step's requests (``slo_count_within_1pct``);
- ``admitted_p99_under_slo``: the p99 of what was admitted stays under the SLO;
- RSS (MiB) of the gateway worker and of each function instance's worker at
  the end of the step.

Targets: the two counts agree within 1% at every step; above
capacity the admitted requests keep p99 under the SLO and the rest are shed.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from gnn_faas.bench.open_loop import poisson_arrivals, run_open_loop
from gnn_faas.bench.store_proxy import add_store_arguments, store_access, store_fields
from gnn_faas.errors import InvalidRequest
from gnn_faas.stack import Stack, prepared_model
from gnn_faas.stack_memory import by_role, stack_rss

DEFAULT_RATES = "1,10,40,100,200,400"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", help="graph (and dataset) name")
    p.add_argument("--rates", default=DEFAULT_RATES, help="comma-separated requests/s per step")
    p.add_argument("--step-seconds", type=float, default=20.0, help="duration of each step")
    p.add_argument("--slo", type=float, default=0.3, help="SLO in seconds (λGrapher: 0.3)")
    add_store_arguments(p)
    p.add_argument("--arch", default="gcn")
    p.add_argument("--mode", default="graph_sharing",
                   choices=["graph_sharing", "no_sharing", "request_centric"])  # fmt: skip
    p.add_argument("--no-admission", action="store_true", help="admit everything (baseline)")
    p.add_argument("--max-instances", type=int, default=2, help="per function")
    p.add_argument("--memory-mb", type=int, default=256)
    p.add_argument("--compute-mb", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)


def stack_config(args: argparse.Namespace, store: str, ckpt: str) -> dict:
    return {
        "store": store,
        "gateway": {"admission": not args.no_admission},
        "platform": {
            "memory_function_mb": args.memory_mb,
            "compute_function_mb": args.compute_mb,
            "max_memory_instances": args.max_instances,
            "max_compute_instances": args.max_instances,
            "min_instances": 1,
        },
        "models": [{
            "name": args.graph, "graph": args.graph, "dataset": args.graph,
            "checkpoint": ckpt, "slo_s": args.slo, "mode": args.mode,
        }],
    }  # fmt: skip


def request_targets(graph, n: int, seed: int) -> np.ndarray:
    """The graph's real request order (tiled), else uniform vertices."""
    order = graph.read_blob("request_order") if graph.has("request_order") else None
    if order is None or order.size == 0:
        return np.random.default_rng(seed).integers(0, graph.num_nodes, n)
    return np.tile(order, math.ceil(n / order.size))[:n]


def model_totals(status: dict, model: str) -> dict:
    for m in status["models"]:
        if m["model"] == model:
            return dict(m["totals"])
    return {}


def run(args: argparse.Namespace) -> dict:
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        raise InvalidRequest(
            f"--rates must be comma-separated numbers, got {args.rates!r}"
        ) from None
    if not rates or min(rates) <= 0 or args.step_seconds <= 0:
        raise InvalidRequest("--rates must be positive and --step-seconds > 0")
    base, graph, ckpt = prepared_model(args.store, args.graph, args.arch, args.slo)
    out: dict = {
        "graph": args.graph,
        "slo_s": args.slo,
        "mode": args.mode,
        "admission": not args.no_admission,
        "step_seconds": args.step_seconds,
        "max_instances": args.max_instances,
        **store_fields(base.store, args.store_rtt_ms),
        "steps": [],
    }
    with (
        store_access(base.store, args.store_rtt_ms) as (uri, env, _),
        Stack(stack_config(args, uri, ckpt), env=env) as stack,
    ):
        # warm caches and connections outside the measured steps
        warm = request_targets(graph, 10, args.seed)
        run_open_loop(stack.url, args.graph, np.linspace(0, 1.0, warm.size), warm)
        for k, rate in enumerate(rates):
            due = poisson_arrivals(rate, args.step_seconds, seed=args.seed + k)
            targets = request_targets(graph, due.size, args.seed + k)
            before = model_totals(stack.status(), args.graph)
            t0 = time.monotonic()
            result = run_open_loop(stack.url, args.graph, due, targets)
            wall = time.monotonic() - t0
            status = stack.status()
            after = model_totals(status, args.graph)
            client = result.summary(args.slo)
            gw = {k2: after.get(k2, 0) - before.get(k2, 0) for k2 in after}
            diff = gw.get("slo_violations", 0) - client["slo_violations"]
            rss = stack_rss(stack.proc.pid, status)
            out["steps"].append(
                {
                    "rate": rate,
                    "wall_s": wall,
                    # answered (200) per second of the step: the admitted throughput
                    "admitted_rps": client["ok"] / args.step_seconds,
                    "client": client,
                    "gateway": gw,
                    "slo_count_diff": diff,
                    "slo_count_within_1pct": abs(diff) <= 0.01 * max(1, client["requests"]),
                    "shed_counts_agree": gw.get("shed", 0) == client["shed"],
                    "admitted_p99_under_slo": client["p99_ms"] <= args.slo * 1e3,
                    "rss_mib": {k2: round(v, 1) for k2, v in rss.items()},
                    "rss_mib_by_role": {k2: round(v, 1) for k2, v in by_role(rss).items()},
                }
            )
    steps = out["steps"]
    out["all_slo_counts_within_1pct"] = all(s["slo_count_within_1pct"] for s in steps)
    out["all_admitted_p99_under_slo"] = all(s["admitted_p99_under_slo"] for s in steps)
    out["shed_total"] = sum(s["client"]["shed"] for s in steps)
    out["max_admitted_rps"] = max(s["admitted_rps"] for s in steps)
    return out

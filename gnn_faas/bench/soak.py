"""``gnn-faas bench soak``: a steady open-loop load for minutes, RSS per process.

A ``gnn-faas up`` stack (graph sharing, local platform, fixed instance counts
so the processes stay the same) gets Poisson arrivals at ``--rate`` for
``--minutes``, sent in chunks of ``--sample-seconds``; after each chunk the
resident memory (RSS) of the gateway worker and of every function instance's
worker is sampled (by the PIDs the stack reports). After ``--warmup-minutes``:

- ``slope_mib_per_min``: least-squares slope of RSS over time, per process;
- ``relative_change``: (mean of the last 10% of samples - mean of the first 10%
  after warm-up) / the latter;
- ``flat_within_5pct``: ``|relative_change| <= 0.05`` for every process.

Client-side figures (p50/p99, SLO violations, shed) cover the whole run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gnn_faas.bench.open_loop import LoadResult, poisson_arrivals, run_open_loop
from gnn_faas.bench.overload import request_targets
from gnn_faas.errors import InvalidRequest
from gnn_faas.stack import Stack, prepared_model
from gnn_faas.stack_memory import stack_rss


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", help="graph (and dataset) name")
    p.add_argument("--rate", type=float, default=50.0, help="requests per second")
    p.add_argument("--minutes", type=float, default=20.0, help="duration of the load")
    p.add_argument("--warmup-minutes", type=float, default=2.0, help="left out of the slope")
    p.add_argument("--sample-seconds", type=float, default=10.0, help="RSS sampling period")
    p.add_argument("--slo", type=float, default=0.3)
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--arch", default="gcn")
    p.add_argument("--max-instances", type=int, default=1, help="per function (fixed)")
    p.add_argument("--memory-mb", type=int, default=256)
    p.add_argument("--compute-mb", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)


def rss_trend(t_min: np.ndarray, mib: np.ndarray) -> dict:
    """Slope (MiB/min, least squares) and relative change of one RSS series."""
    if t_min.size < 2:
        return {"slope_mib_per_min": 0.0, "relative_change": 0.0, "samples": int(t_min.size)}
    slope = float(np.polyfit(t_min, mib, 1)[0])
    k = max(1, t_min.size // 10)
    first, last = float(mib[:k].mean()), float(mib[-k:].mean())
    return {
        "slope_mib_per_min": slope,
        "relative_change": (last - first) / first if first else 0.0,
        "start_mib": first,
        "end_mib": last,
        "samples": int(t_min.size),
    }


def run(args: argparse.Namespace) -> dict:
    if args.rate <= 0 or args.minutes <= 0 or args.sample_seconds <= 0:
        raise InvalidRequest("--rate, --minutes and --sample-seconds must be > 0")
    base, graph, ckpt = prepared_model(args.store, args.graph, args.arch, args.slo)
    config = {
        "store": base.store,
        "platform": {
            "memory_function_mb": args.memory_mb,
            "compute_function_mb": args.compute_mb,
            "max_memory_instances": args.max_instances,
            "max_compute_instances": args.max_instances,
            "min_instances": args.max_instances,
            "keep_alive_s": 3600.0,
        },
        "models": [{
            "name": args.graph, "graph": args.graph, "dataset": args.graph,
            "checkpoint": ckpt, "slo_s": args.slo, "mode": "graph_sharing",
        }],
    }  # fmt: skip
    total = LoadResult()
    samples: list[tuple[float, dict[str, float]]] = []
    chunks = max(1, int(round(args.minutes * 60 / args.sample_seconds)))
    with Stack(config) as stack:
        t0 = time.monotonic()
        for k in range(chunks):
            due = poisson_arrivals(args.rate, args.sample_seconds, seed=args.seed + k)
            targets = request_targets(graph, due.size, args.seed + k)
            part = run_open_loop(stack.url, args.graph, due, targets)
            total.outcomes.extend(part.outcomes)
            total.late_sends += part.late_sends
            samples.append((time.monotonic() - t0, stack_rss(stack.proc.pid, stack.status())))
    t_min = np.array([t for t, _ in samples]) / 60.0
    after = t_min >= args.warmup_minutes
    labels = sorted({lab for _, rss in samples for lab in rss})
    processes = {}
    for lab in labels:
        series = np.array([rss.get(lab, np.nan) for _, rss in samples])
        ok = after & ~np.isnan(series)
        processes[lab] = {
            **rss_trend(t_min[ok], series[ok]),
            "series_mib": [round(float(v), 1) for v in series],
        }
    return {
        "graph": args.graph,
        "rate": args.rate,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes,
        "sample_times_min": [round(float(t), 3) for t in t_min],
        "client": total.summary(args.slo),
        "processes": processes,
        "flat_within_5pct": all(
            abs(p["relative_change"]) <= 0.05 for p in processes.values() if p["samples"] >= 2
        ),
    }

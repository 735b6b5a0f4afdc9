"""``gnn-faas demo``: what ``make run`` does.

Brings the embedded default stack up (``gnn-faas up``: local platform, file
store, bundled Bitcoin OTC graph and a GCN trained on its vertex task), sends a
short stream of real requests (Bitcoin OTC's request order at Twitter-trace
arrival times), prints a summary (latency percentiles, SLO violations, sharing
degree, GB-s per request, cold starts, cache hit rate) and shuts everything down.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="bring the stack up, send real requests, summarise, stop")
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--rps", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    import numpy as np

    from gnn_faas.bench.e2e import summarise
    from gnn_faas.config import ServingConfig
    from gnn_faas.stack import Stack, prepare
    from gnn_faas.storage.format import open_graph
    from gnn_faas.traces.replay import replay
    from gnn_faas.traces.twitter import arrivals

    say = lambda msg: print(f"gnn-faas demo: {msg}", file=sys.stderr, flush=True)  # noqa: E731
    config = ServingConfig(store=args.store or "")
    m = config.models[0]
    say(f"store {config.store}; model {m.name!r} ({m.arch}, SLO {m.slo_s} s)")
    prepare(config, log=say)
    graph = open_graph(config.store, m.graph)
    order = graph.read_blob("request_order")
    times = arrivals(args.rps, args.duration)
    targets = order[: times.size]
    stack_cfg = {
        "store": config.store,
        "models": [{"name": m.name, "graph": m.graph, "dataset": m.dataset,
                    "checkpoint": str(config.checkpoint_dir(m))}],
    }  # fmt: skip
    t0 = time.monotonic()
    with Stack(stack_cfg) as stack:
        say(f"gateway ready at {stack.url} in {time.monotonic() - t0:.1f} s")
        say(f"sending {times.size} requests over {args.duration:.0f} s (Twitter trace arrivals)")
        w0 = time.monotonic()
        result = replay(stack.url, m.name, times, targets)
        w1 = time.monotonic()
        status = stack.status(window_start=w0, window_end=w1)
        startup = stack.status()["metering"]["total"]
        say("shutting down")
    summary = summarise(result, m.slo_s, status["metering"]["total"])
    summary["startup_cold_starts"] = int(startup["cold_starts"])
    summary["startup_cold_start_s_mean"] = startup["cold_start_s_total"] / max(
        startup["cold_starts"], 1
    )
    caches = [c for mdl in status["models"] for c in mdl.get("caches", [])]
    if caches:
        summary["cache_hit_rate"] = float(np.mean([c.get("hit_rate", 0.0) for c in caches]))
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(
            f"requests {summary['requests']} ok {summary['ok']} errors {summary['errors']}\n"
            f"latency p50 {summary['p50_ms']:.1f} ms  p99 {summary['p99_ms']:.1f} ms  "
            f"SLO violations {summary['slo_violations']}\n"
            f"sharing degree {summary['sharing_degree']:.3f} over {summary['buffers']} buffers; "
            f"aggregated rows/request {summary['aggregated_rows_per_request']:.1f}\n"
            f"GB-s/request {summary['gb_s_per_request']:.4f}  "
            f"vCPU-s/request {summary['vcpu_s_per_request']:.4f}  "
            f"cold starts during the stream {summary['cold_starts']} "
            f"(at start-up {summary['startup_cold_starts']}, "
            f"{summary['startup_cold_start_s_mean']:.2f} s each)"
            + (f"  cache hit rate {summary['cache_hit_rate']:.3f}" if caches else "")
        )
    for msg in result.error_messages[:3]:
        say(f"error example: {msg}")
    return 0 if result.errors == 0 else 1

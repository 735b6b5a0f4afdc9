"""``gnn-faas bench live-vs-sim``: one trace window replayed live and simulated.

A stack is brought up as the bundled calibration of ``--graph`` was measured (its
function sizes, instance caps, keep-alive and SLO; admission off, as the simulator
models none) serving a seeded, untrained 2-layer GCN. ``--minutes`` of the trace
(default: the busiest Azure 2019 function from minute 60) are replayed open loop
after ``--warmup`` seconds played but not measured, and the simulator runs the
gateway's policy on the same window; unless ``--no-fit-warmup`` the profile's
execution times are refitted on the warm-up's executions first
(:func:`gnn_faas.traces.live.warmup_calibration`).

Output (one JSON object)::

    live, simulated: p50_ms, p99_ms, gb_s_per_request, sharing, requests,
                     answered, gb_s, timeline_gb_s, cold_starts
    live also:       max_sample_gap_s, instances_in_window, failed_samples
    ratio:           simulated / live of p50_ms, p99_ms, gb_s_per_request, sharing

``gb_s`` is the metering over the measured window, ``timeline_gb_s`` the integral
of the sampled timeline over the same span; live they differ by design, within

    |timeline_gb_s − gb_s| <= 2 · instances_in_window · largest_instance_gb · max_sample_gap_s

(why: docs/design/live-vs-sim.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.bench.instance_start import default_model
from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import default_store
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.live import replay_window, write_live
from gnn_faas.traces.sources import TRACES, add_trace_arguments

SAMPLE_INTERVAL_S = 1.0  # the status sampler's (traces/replay.py StatusSampler default)
COMPARED = ("p50_ms", "p99_ms", "gb_s_per_request", "sharing")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--graph", default="bitcoin-otc", help="graph with a bundled calibration")
    p.add_argument("--trace", choices=TRACES, default="azure2019", help="arrival trace")
    p.add_argument("--senders", type=int, default=64, help="bounded sender pool size")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (s)")
    p.add_argument(
        "--no-fit-warmup",
        action="store_true",
        help="predict with the bundled profile as it is (default: refit on the warm-up)",
    )
    p.add_argument("--out", default=None, help="also write the live run directory here")
    add_trace_arguments(p, default_minutes=0.5)
    p.set_defaults(start_minute=60.0, warmup=30.0)


def stack_config(cal: Calibration, store: str, graph: str, checkpoint: str) -> dict:
    """The deployment the calibration describes, serving ``checkpoint``."""
    return {
        "store": store,
        "gateway": {"admission": False},
        "platform": {
            "memory_function_mb": int(cal.memory_function_mb),
            "compute_function_mb": int(cal.compute_function_mb),
            "max_memory_instances": cal.max_instances,
            "max_compute_instances": cal.max_instances,
            "min_instances": cal.min_instances,
            "keep_alive_s": cal.keep_alive_s,
        },
        "models": [{"name": graph, "graph": graph, "dataset": graph,
                    "checkpoint": checkpoint, "slo_s": cal.slo_s}],
    }  # fmt: skip


def sampled_integral(samples: list[dict], key: str, end: float) -> float:
    """``∫_0^end`` of the sampled step function (each sample's value holds until
    the next; before the first sample, the first value)."""
    if not samples or end <= 0:
        return 0.0
    t = np.asarray([s["t"] for s in samples], dtype=np.float64)
    v = np.asarray([s[key] for s in samples], dtype=np.float64)
    edges = np.clip(np.concatenate([[0.0], t[1:], [end]]), 0.0, end)
    return float(np.sum(np.diff(edges) * v))


def max_sample_gap(samples: list[dict], end: float) -> float:
    """The longest time between consecutive samples over ``[0, end]``."""
    t = np.asarray([s["t"] for s in samples], dtype=np.float64)
    inside = t[(t > 0) & (t < end)]
    before = t[t <= 0]
    edges = np.concatenate([[before.max() if before.size else 0.0], inside, [end]])
    return float(np.diff(edges).max()) if edges.size > 1 else 0.0


def live_figures(run: Any) -> dict:
    s, result = run.summary, run.result
    end = result.last_answer_s
    return {
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "gb_s_per_request": s["gb_s_per_request"],
        "sharing": s["mean_sharing_degree"],
        "requests": s["requests"],
        "answered": s["ok"],
        "gb_s": s["gb_s"],
        "timeline_gb_s": sampled_integral(run.samples, "allocated_gb", end),
        "cold_starts": s["cold_starts"],
        "max_sample_gap_s": max_sample_gap(run.samples, end),
        "instances_in_window": len(run.status["metering"]["instances"]),
        "failed_samples": run.failed_samples,
    }


def simulated_figures(summary: dict, run: Any) -> dict:
    return {
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "gb_s_per_request": summary["gb_s_per_request"],
        "sharing": summary["mean_sharing_degree"],
        "requests": summary["requests"],
        "answered": summary["completed"],
        "gb_s": summary["gb_s"],
        "timeline_gb_s": float(run.timeline()["allocated_gb"].sum()),
        "cold_starts": summary["cold_starts"],
    }


def replay_args(args: argparse.Namespace, url: str, store: str) -> argparse.Namespace:
    """``gnn-faas replay``'s arguments for this window (the trace ones as given)."""
    return argparse.Namespace(**{
        **vars(args), "url": url, "model": args.graph, "store": store, "out": None,
        "slo": None, "predict": True, "policies": "gnn_faas", "calibration": None,
        "prices": None, "fit_warmup": not args.no_fit_warmup, "no_progress": True,
    })  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    if args.senders < 1 or args.timeout <= 0:
        raise InvalidRequest("--senders must be >= 1 and --timeout positive")
    if not args.no_fit_warmup and args.warmup <= 0:
        raise InvalidRequest("refitting on the warm-up needs --warmup > 0 (or --no-fit-warmup)")
    cal = Calibration.bundled(args.graph)
    store = args.store or default_store()
    ensure_dataset(store, args.graph)
    with tempfile.TemporaryDirectory(prefix="gnn-faas-live-vs-sim-") as tmp:
        ckpt = default_model(f"{tmp}/model", store, args.graph, hidden_dim=64)
        config = stack_config(cal, store, args.graph, ckpt)
        with Stack(config, ready_timeout_s=180) as stack:
            live, sim_runs, measured_s = replay_window(
                args.trace, replay_args(args, stack.url, store)
            )
    sim_summary = live.summary["simulated"]["policies"]["gnn_faas"]
    out_live = live_figures(live)
    out_sim = simulated_figures(sim_summary, sim_runs["gnn_faas"])
    if args.out:
        write_live(Path(args.out), live, measured_s, sim_runs)
    return {
        "graph": args.graph,
        "trace": args.trace,
        "window_s": measured_s,
        "warmup_s": args.warmup,
        "live": out_live,
        "simulated": out_sim,
        "ratio": {k: out_sim[k] / out_live[k] if out_live[k] else None for k in COMPARED},
        "calibration": live.summary["simulated"]["calibration"],
        "sample_interval_s": SAMPLE_INTERVAL_S,
        "launches_in_window": int(out_live["cold_starts"]),
        "largest_instance_gb": max(cal.memory_function_mb, cal.compute_function_mb) / 1024,
        "errors": live.summary["error_examples"],
    }

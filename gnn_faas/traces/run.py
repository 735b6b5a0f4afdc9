"""Simulating a trace end to end: load, map onto the graph, run the policies,
summarise (and write a run directory with CSVs, JSON and plots)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.config import BufferSettings, GatewayConfig, ModelServingConfig, ServingConfig
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.gateway.buffer_pool import BufferConfig
from gnn_faas.gateway.timeout_configurator import load_configurator
from gnn_faas.scheduler.function_pool import LoadAwarePolicy
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.traces import plots
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.request_stream import build_stream
from gnn_faas.traces.rundir import write_timeline
from gnn_faas.traces.simulator import SimulationSetup, parse_policies, simulate
from gnn_faas.traces.sources import load_trace


def open_prepared_graph(graph: str, store: str | None) -> tuple[Any, str]:
    cfg = ServingConfig(store=store or "", models=(ModelServingConfig(name=graph, graph=graph),))
    try:
        return open_graph(cfg.store, graph), cfg.store
    except NotFound:
        ensure_dataset(cfg.store, graph)
        return open_graph(cfg.store, graph), cfg.store


def setup_simulation(
    trace: Any,
    graph: Any,
    calibration: Any,
    slo_s: float | None = None,
    policy_cls: Any = None,
    buffer_settings: Any = None,
    workers: int = 1,
    fanouts: Sequence[int] | None = None,
    timeout_s: float = 30.0,
) -> Any:
    """The policies' shared setup: the stream with k-hop sets (sampled with
    ``fanouts``, full without) and the gateway's buffer configuration and
    timeout configurator for the graph. ``timeout_s``: the platform's request
    timeout (a request whose answer would come later is dropped)."""
    if trace.requests == 0:
        raise InvalidRequest(f"the {trace.name} trace window holds no arrivals")
    slo = slo_s or calibration.slo_s
    bcfg = BufferConfig.from_settings(buffer_settings or BufferSettings(), slo)
    configurator = load_configurator(None, graph=graph.name, config=bcfg)
    stream = build_stream(graph, trace.arrivals, calibration.hops, fanouts)
    return SimulationSetup(
        stream=stream,
        calibration=calibration,
        num_nodes=graph.num_nodes,
        duration_s=float(trace.duration_s),
        buffer_config=bcfg,
        configurator=configurator,
        policy_cls=policy_cls or LoadAwarePolicy,
        workers=max(1, int(workers)),
        timeout_s=float(timeout_s),
    )


def simulation_fanouts(args: argparse.Namespace, calibration: Calibration) -> tuple | None:
    """``--fanouts`` when given (parsed by the CLI into a tuple; ``-1``
    entries: all neighbours), else the fanouts the calibration's executions
    were measured with."""
    given = getattr(args, "fanouts", None)
    fanouts = tuple(given) if given else calibration.fanouts
    if fanouts is not None and len(fanouts) != calibration.hops:
        raise InvalidRequest(
            f"--fanouts needs one fanout per hop ({calibration.hops}), got {len(fanouts)}"
        )
    if fanouts is not None and not any(f >= 0 for f in fanouts):
        return None
    return fanouts


def request_timeout(args: argparse.Namespace) -> float:
    """``--request-timeout`` (seconds), else the gateway's default
    ``request_timeout_s`` (30 s)."""
    given = getattr(args, "request_timeout", None)
    return float(given) if given is not None else GatewayConfig().request_timeout_s


def buffer_settings(args: argparse.Namespace) -> Any:
    """The ``buffers`` settings with the command line's ``--objective`` and
    ``--latency-slack`` (when given)."""
    import dataclasses

    from gnn_faas.config import BufferSettings

    b = BufferSettings()
    if getattr(args, "objective", None) is not None:
        b = dataclasses.replace(b, objective=args.objective)
    if getattr(args, "latency_slack", None) is not None:
        b = dataclasses.replace(b, latency_slack=args.latency_slack)
    return b


def progress_bar(total: int, enabled: bool, desc: str):
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="req", unit_scale=True, leave=False)
    last = [0]

    def update(i: int) -> None:
        bar.update(i - last[0])
        last[0] = i

    return update, bar.close


FRONTIER = (
    ("cost", "cost", 0.1),
    ("slack 1.0", "balanced", 1.0),
    ("slack 0.5", "balanced", 0.5),
    ("slack 0.3", "balanced", 0.3),
    ("balanced", "balanced", 0.1),
    ("latency", "latency", 0.0),
)  # (label, objective, latency_slack) from cheapest to fastest


def frontier_point(label: str, objective: str, slack: float, summary: dict) -> dict:
    keys = ("mean_ms", "p50_ms", "p99_ms", "gb_s_per_request", "slo_violations")
    point = {k: summary[k] for k in keys if k in summary}
    return {"label": label, "objective": objective, "latency_slack": slack, **point}


def simulate_frontier(trace_name: str, args: argparse.Namespace) -> dict:
    """gnn_faas under each objective of :data:`FRONTIER` and every other policy
    once, on the same stream: JSON points, and with ``--out`` a PNG."""
    import dataclasses

    from gnn_faas.traces.calibration import Calibration
    from gnn_faas.traces.cost import load_prices
    from gnn_faas.traces.plots import frontier
    from gnn_faas.traces.simulator import parse_policies, simulate
    from gnn_faas.traces.sources import load_trace

    t0 = time.perf_counter()
    prices = load_prices(args.prices)
    cal = (
        Calibration.load(args.calibration) if args.calibration else Calibration.bundled(args.graph)
    )
    trace = load_trace(trace_name, args)
    graph, _ = open_prepared_graph(args.graph, args.store)
    fanouts = simulation_fanouts(args, cal)
    setup = setup_simulation(trace, graph, cal, args.slo, workers=args.workers, fanouts=fanouts,
                             timeout_s=request_timeout(args))  # fmt: skip
    slo = setup.buffer_config.slo_s

    def summary(run) -> dict:
        return run.after(trace.warmup_s).summary(slo, prices, trace.measured_s)

    others = [p for p in parse_policies(args.policies) if p != "gnn_faas"]
    baselines = {n: summary(r) for n, r in simulate(setup, others).items()}
    points = []
    for label, objective, slack in FRONTIER:
        bc = dataclasses.replace(setup.buffer_config, objective=objective, latency_slack=slack)
        run = simulate(dataclasses.replace(setup, buffer_config=bc), ["gnn_faas"])["gnn_faas"]
        points.append(frontier_point(label, objective, slack, summary(run)))
    keys = ("mean_ms", "p50_ms", "p99_ms", "gb_s_per_request", "slo_violations")
    result = {
        "wall_s": time.perf_counter() - t0,
        "trace": trace_name,
        "graph": args.graph,
        "requests": trace.measured_requests,
        "slo_s": slo,
        "gnn_faas": points,
        "baselines": {n: {k: s[k] for k in keys} for n, s in baselines.items()},
    }
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        frontier(out / "frontier.png", points, result["baselines"])
        result["png"] = str(out / "frontier.png")
    return result


def simulate_trace(trace_name: str, args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    policies = parse_policies(args.policies)
    prices = load_prices(args.prices)
    cal = (
        Calibration.load(args.calibration) if args.calibration else Calibration.bundled(args.graph)
    )
    trace = load_trace(trace_name, args)
    graph, _ = open_prepared_graph(args.graph, args.store)
    fanouts = simulation_fanouts(args, cal)
    setup = setup_simulation(
        trace, graph, cal, args.slo, buffer_settings=buffer_settings(args), workers=args.workers,
        fanouts=fanouts, timeout_s=request_timeout(args),
    )  # fmt: skip
    update, close = progress_bar(trace.requests, not args.no_progress and not args.json, "gnn_faas")
    runs = simulate(setup, policies, update)
    close()
    slo = setup.buffer_config.slo_s
    # figures for the window after the warm-up (the whole trace without one)
    runs = {n: r.after(trace.warmup_s) for n, r in runs.items()}
    result = {
        "wall_s": time.perf_counter() - t0,
        "requests": trace.measured_requests,
        "trace": trace_name,
        "graph": args.graph,
        "duration_s": trace.measured_s,
        "warmup_s": trace.warmup_s,
        "slo_s": slo,
        "calibration": cal.meta.get("measured_at", ""),
        "fanouts": list(fanouts) if fanouts else None,
        "rows_per_request_mean": float(setup.stream.sizes.mean()),
        "policies": {n: r.summary(slo, prices, trace.measured_s) for n, r in runs.items()},
    }
    add_timeout_latency(result, runs, setup.timeout_s)
    add_storage(result, graph, cal.hops, prices, trace.measured_s, fanouts)
    if args.out:
        write_simulation(Path(args.out), result, runs)
        result["out"] = args.out
    return result


def add_timeout_latency(result: dict, runs: dict, timeout_s: float) -> None:
    """Each policy's ``mean_ms_all``/``p99_ms_all``: every request's latency,
    a dropped one counted at the request timeout (a lower bound of its wait);
    ``mean_ms``/``p99_ms`` cover the completed requests only, which flatters a
    policy that drops the requests waiting for a slow start."""
    result["timeout_s"] = timeout_s
    for name, run in runs.items():
        lat = np.where(run.dropped, timeout_s, run.done - run.arrivals)
        p = result["policies"][name]
        p["mean_ms_all"] = float(lat.mean() * 1e3) if lat.size else 0.0
        p["p99_ms_all"] = float(np.percentile(lat, 99) * 1e3) if lat.size else 0.0


def add_storage(
    result: dict, graph: Any, hops: int, prices: dict, duration_s: float,
    fanouts: Sequence[int] | None = None,
) -> None:  # fmt: skip
    """Each policy's storage requests and dollars (``storage``) beside its
    compute ``dollars``, from fetches measured on the graph under the bundled
    S3 constants (:mod:`gnn_faas.traces.storage_requests`)."""
    from gnn_faas.traces.request_stream import request_order
    from gnn_faas.traces.storage_requests import measure_fetch_requests, storage_per_policy

    model = measure_fetch_requests(graph, hops, request_order(graph), fanouts=fanouts)
    storage = storage_per_policy(result["policies"], model, prices, duration_s)
    for name, s in storage.items():
        result["policies"][name]["storage"] = s
    result["storage_model"] = model.as_dict()


def write_simulation(out: Path, result: dict, runs: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    timelines = {}
    for name, run in runs.items():
        timelines[name] = run.timeline()
        write_timeline(out / f"timeline_{name}.csv", timelines[name])
    (out / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    lat = {n: r.latency[~r.dropped] for n, r in runs.items()}
    plots.latency_cdf(out / "latency_cdf.png", lat, result["slo_s"])
    plots.rate_and_instances(out / "rate_instances.png", timelines)
    plots.memory_over_time(out / "memory.png", timelines)
    plots.cost_per_policy(
        out / "cost.png", {n: p["dollars"] for n, p in result["policies"].items()}
    )

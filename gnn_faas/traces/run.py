"""Simulating a trace end to end: load, map onto the graph, run the policies,
summarise (and write a run directory with CSVs, JSON and plots)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.config import (
    BufferSettings,
    GatewayConfig,
    GraphsConfig,
    ModelServingConfig,
    ServingConfig,
)
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.gateway.buffer_pool import BufferConfig
from gnn_faas.gateway.timeout_configurator import load_configurator
from gnn_faas.scheduler.function_pool import LoadAwarePolicy
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.traces import plots
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.parallel import Job, run_jobs
from gnn_faas.traces.request_stream import build_stream
from gnn_faas.traces.rundir import RequestRecords, read_timeline, write_timeline
from gnn_faas.traces.simulator import (
    POLICIES,
    SimulationSetup,
    billing_of,
    parse_policies,
    summarise,
)
from gnn_faas.traces.sources import load_trace
from gnn_faas.traces.update_cost import (
    UpdatePlan,
    plan_summary,
    plan_updates,
    update_costs,
    update_options,
)
from gnn_faas.traces.update_stream import update_stream


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
    repeats: int = 1,
) -> Any:
    """The policies' shared setup: the stream with k-hop sets (sampled with
    ``fanouts``, full without) and the gateway's buffer configuration and
    timeout configurator for the graph. ``timeout_s``: the platform's request
    timeout (a request whose answer would come later is dropped); ``repeats``:
    the trace played that many times back to back (``--days``)."""
    if trace.requests == 0:
        raise InvalidRequest(f"the {trace.name} trace window holds no arrivals")
    slo = slo_s or calibration.slo_s
    bcfg = BufferConfig.from_settings(buffer_settings or BufferSettings(), slo)
    configurator = load_configurator(None, graph=graph.name, config=bcfg)
    stream = build_stream(graph, trace.arrivals, calibration.hops, fanouts,
                          repeats=repeats, period_s=float(trace.duration_s))  # fmt: skip
    return SimulationSetup(
        stream=stream,
        calibration=calibration,
        num_nodes=graph.num_nodes,
        duration_s=float(trace.duration_s) * max(int(repeats), 1),
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
    b = BufferSettings()
    if getattr(args, "objective", None) is not None:
        b = dataclasses.replace(b, objective=args.objective)
    if getattr(args, "latency_slack", None) is not None:
        b = dataclasses.replace(b, latency_slack=args.latency_slack)
    return b


def progress_bar(total: int, enabled: bool, desc: str):
    """A tqdm bar over ``total`` simulated requests (None when disabled)."""
    if not enabled:
        return None
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: simulation jobs fork
    return tqdm(total=total, desc=desc, unit="req", unit_scale=True, leave=False)


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
    once, on the same stream (each point a job on its own core): JSON points,
    and with ``--out`` a PNG."""
    from gnn_faas.traces.plots import frontier

    t0 = time.perf_counter()
    prices = load_prices(args.prices)
    cal = (
        Calibration.load(args.calibration) if args.calibration else Calibration.bundled(args.graph)
    )
    trace = load_trace(trace_name, args)
    graph, _ = open_prepared_graph(args.graph, args.store)
    fanouts = simulation_fanouts(args, cal)
    setup = setup_simulation(trace, graph, cal, args.slo, workers=args.workers, fanouts=fanouts,
                             timeout_s=request_timeout(args),
                             repeats=trace_repeats(args))  # fmt: skip
    slo = setup.buffer_config.slo_s
    jobs = []
    for label, objective, slack in FRONTIER:
        bc = dataclasses.replace(setup.buffer_config, objective=objective, latency_slack=slack)
        jobs.append(policy_job("gnn_faas", dataclasses.replace(setup, buffer_config=bc), trace,
                               slo, prices, label=label))  # fmt: skip
    others = [p for p in parse_policies(args.policies) if p != "gnn_faas"]
    jobs += [policy_job(n, setup, trace, slo, prices) for n in others]
    results = run_jobs_with_bar(jobs, args, "frontier")
    points = [
        frontier_point(label, objective, slack, r["summary"])
        for (label, objective, slack), r in zip(FRONTIER, results, strict=False)
    ]
    keys = ("mean_ms", "p50_ms", "p99_ms", "gb_s_per_request", "slo_violations")
    baselines = {n: r["summary"] for n, r in zip(others, results[len(FRONTIER) :], strict=True)}
    result = {
        "wall_s": time.perf_counter() - t0,
        "trace": trace_name,
        "graph": args.graph,
        "requests": measured_requests(trace, setup),
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


def trace_repeats(args: argparse.Namespace) -> int:
    """``--days N``: the whole trace played N times back to back."""
    return max(int(getattr(args, "days", None) or 1), 1)


def measured_requests(trace: Any, setup: Any) -> int:
    """Requests after the warm-up (every repeat of the trace)."""
    return trace.measured_requests + trace.requests * (setup.stream.repeats - 1)


def policy_job(name: str, setup: Any, trace: Any, slo: float, prices: dict,
               out: Path | None = None, label: str | None = None) -> Job:  # fmt: skip
    """Policy ``name`` simulated and summarised (``out``: with its timeline
    CSV and per-request records written there) as a :class:`Job`."""
    measured_s = trace.measured_s + trace.duration_s * (setup.stream.repeats - 1)

    def run(progress) -> dict:
        records = None
        if out is not None:
            records = RequestRecords(out / f"requests_{name}.npy", len(setup.stream),
                                     setup.timeout_s)  # fmt: skip
        summary, acc = summarise(name, setup, slo_s=slo, prices=prices,
                                 warmup_s=trace.warmup_s, measured_s=measured_s,
                                 progress=progress, timeline=out is not None,
                                 records=records)  # fmt: skip
        try:
            result = {"name": name, "summary": summary}
            if out is not None:
                records.close()
                write_timeline(out / f"timeline_{name}.csv", acc.timeline_columns())
                ms, frac = acc.latency_cdf()
                keep = np.flatnonzero(np.diff(np.concatenate([[0.0], frac])) > 0)
                result["cdf"] = [ms[keep].tolist(), frac[keep].tolist()]
            return result
        finally:
            acc.close()

    return Job(label or name, run, len(setup.stream))


def run_jobs_with_bar(jobs: list[Job], args: argparse.Namespace, desc: str) -> list[dict]:
    """:func:`run_jobs` on ``--workers`` processes, with a progress bar over
    every job's requests unless ``--no-progress`` or ``--json``."""
    show = not getattr(args, "no_progress", False) and not getattr(args, "json", False)
    bar = progress_bar(sum(j.size for j in jobs), show, desc)
    try:
        return run_jobs(jobs, max(int(getattr(args, "workers", 1) or 1), 1), bar)
    finally:
        if bar is not None:
            bar.close()


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
        fanouts=fanouts, timeout_s=request_timeout(args), repeats=trace_repeats(args),
    )  # fmt: skip
    duration = trace.measured_s + trace.duration_s * (setup.stream.repeats - 1)
    plan = update_plan(args, graph, trace.warmup_s, duration)
    if plan is not None:
        setup = dataclasses.replace(setup, updates=plan)
    slo = setup.buffer_config.slo_s
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    # longest first: gnn_faas's loop, then faas_gnn's, then the vectorised pools
    order = sorted(policies, key=POLICIES.index)
    jobs = [policy_job(n, setup, trace, slo, prices, out) for n in order]
    done = dict(zip(order, run_jobs_with_bar(jobs, args, "simulate"), strict=True))
    n = len(setup.stream)
    result = {
        "wall_s": time.perf_counter() - t0,
        "requests": measured_requests(trace, setup),
        "trace": trace_name,
        "graph": args.graph,
        "duration_s": duration,
        "warmup_s": trace.warmup_s,
        "slo_s": slo,
        "calibration": cal.meta.get("measured_at", ""),
        "fanouts": list(fanouts) if fanouts else None,
        "rows_per_request_mean": setup.stream.size_stats()[1] / max(n, 1),
        "policies": {p: done[p]["summary"] for p in policies},
        "timeout_s": setup.timeout_s,
    }
    if trace_repeats(args) > 1:
        result["days"] = trace_repeats(args)
    model = add_storage(result, graph, cal.hops, prices, duration, fanouts)
    if plan is not None:
        add_update_costs(result, setup, plan, prices, model.per_row)
    if out is not None:
        write_simulation(out, result, {p: done[p] for p in policies})
        result["out"] = args.out
    return result


def add_storage(
    result: dict, graph: Any, hops: int, prices: dict, duration_s: float,
    fanouts: Sequence[int] | None = None,
) -> Any:  # fmt: skip
    """Each policy's storage requests and dollars (``storage``) beside its
    compute ``dollars``, from fetches measured on the graph under the bundled
    S3 constants (:mod:`gnn_faas.traces.storage_requests`); the fetch model."""
    from gnn_faas.traces.request_stream import request_order
    from gnn_faas.traces.storage_requests import measure_fetch_requests, storage_per_policy

    model = measure_fetch_requests(graph, hops, request_order(graph), fanouts=fanouts)
    storage = storage_per_policy(result["policies"], model, prices, duration_s)
    for name, s in storage.items():
        result["policies"][name]["storage"] = s
    result["storage_model"] = model.as_dict()
    return model


def update_plan(args: argparse.Namespace, graph: Any, start_s: float,
                duration_s: float) -> UpdatePlan | None:  # fmt: skip
    """``--updates NAME`` (at ``--update-rate`` edges/s, in batches of
    ``--update-batch``) as batches over the measured window, with the
    compactions the serving config's ``graphs.compact_share`` triggers."""
    options = update_options(args)
    if options is None:
        return None
    name, rate, batch = options
    stream = update_stream(name, graph)
    plan = plan_updates(stream, rate=rate, batch=batch, start_s=start_s, duration_s=duration_s,
                        graph=graph, compact_share=GraphsConfig().compact_share)  # fmt: skip
    if plan.size == 0:
        raise InvalidRequest(f"no batch of {batch} edges of {name} falls within the window")
    return plan


def add_update_costs(result: dict, setup: Any, plan: UpdatePlan, prices: dict,
                     per_row_gets: float) -> None:  # fmt: skip
    """Each policy's ``updates`` (:func:`gnn_faas.traces.update_cost.update_costs`)
    from what its graph-reading instances read, and the stream's ``updates``."""
    cal = setup.calibration
    bandwidth = cal.graph_mb / cal.full_fetch_s if cal.full_fetch_s > 0 else float("inf")
    for name, s in result["policies"].items():
        billing = billing_of(name, setup)
        if billing.stages == 2:  # the memory functions read the graph
            mb, vcpus = billing.functions[0]
        else:
            mb, vcpus = (sum(x) for x in zip(*billing.functions, strict=True))
        s["updates"] = update_costs(
            name, s.pop("update_reads"), plan, reader_mb=mb, reader_vcpus=vcpus,
            graph_mb=cal.full_graph_mb, bandwidth_mb_s=bandwidth, row_bytes=cal.row_bytes,
            per_row_gets=per_row_gets, prices=prices, requests=s["requests"],
        )  # fmt: skip
    result["updates"] = plan_summary(plan)


def write_simulation(out: Path, result: dict, jobs: dict[str, dict]) -> None:
    """``summary.json`` and the plots, beside the timelines and request
    records each policy's job wrote."""
    (out / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    timelines = {n: read_timeline(out / f"timeline_{n}.csv") for n in jobs}
    plots.latency_cdf_curves(out / "latency_cdf.png",
                             {n: tuple(map(np.asarray, j["cdf"])) for n, j in jobs.items()},
                             result["slo_s"])  # fmt: skip
    plots.rate_and_instances(out / "rate_instances.png", timelines)
    plots.memory_over_time(out / "memory.png", timelines)
    plots.cost_per_policy(
        out / "cost.png", {n: p["dollars"] for n, p in result["policies"].items()}
    )

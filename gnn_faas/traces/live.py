"""``gnn-faas replay``: a trace replayed live against a gateway, into a run directory.

The trace's arrivals are mapped onto the served graph's real request order
(the graph is read from ``--store``), replayed open loop
(:func:`gnn_faas.traces.replay.replay`) while a sampler records the gateway's
instances every second, then written out:

- ``requests.csv``: arrival, send, latency, status, buffer wait, sharing
  degree, execution id, whether a cold start was under way while it was in flight;
- ``timeline.csv``: every second: arrivals, completions, in flight, instances
  per function, allocated and busy GB;
- ``summary.json``: latency, SLO, the platform's metering over the replay
  (GB-s, vCPU-s, cold starts), dollars, and with ``--predict`` the
  simulator's figures for the same window beside the measured ones;
- PNG plots (latency CDF, arrivals and instances, memory, cost per policy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces import plots
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import dollars, load_prices
from gnn_faas.traces.measure_calibration import replay_executions, share_of
from gnn_faas.traces.replay import StatusSampler, UpdateSender, replay
from gnn_faas.traces.request_stream import khop_sets, map_targets, request_order
from gnn_faas.traces.run import open_prepared_graph, setup_simulation
from gnn_faas.traces.rundir import write_requests, write_timeline
from gnn_faas.traces.simulator import parse_policies, simulate
from gnn_faas.traces.sources import load_trace
from gnn_faas.traces.storage_requests import measure_fetch_requests, storage_per_policy
from gnn_faas.traces.timeline import counts_per_second, in_flight
from gnn_faas.traces.update_cost import update_options, window_batches
from gnn_faas.traces.update_stream import update_stream

# the live gateway's mode -> the simulator policy that models it
MODE_POLICY = {"graph_sharing": "gnn_faas", "no_sharing": "faas_gnn",
               "request_centric": "request_centric"}  # fmt: skip


def model_metadata(url: str, model: str) -> dict:
    try:
        r = requests.get(f"{url.rstrip('/')}/v2/models/{model}", timeout=10)
    except requests.RequestException as exc:
        raise InvalidRequest(f"cannot reach the gateway at {url}: {exc}") from None
    if r.status_code != 200:
        raise InvalidRequest(f"model {model!r} at {url}: {r.status_code} {r.text[:200]}")
    return r.json()


def timeline_from(result: Any, samples: list[dict], seconds: int) -> dict[str, np.ndarray]:
    ok = result.status == 200
    done = np.where(ok, result.send + result.latency, np.inf)
    tl: dict[str, np.ndarray] = {
        "second": np.arange(seconds),
        "arrivals": counts_per_second(result.arrival, seconds),
        "completions": counts_per_second(done[ok], seconds),
        "in_flight": in_flight(result.send, done, seconds),
    }
    names = sorted({f for s in samples for f in s["instances"]})
    ts = np.asarray([s["t"] for s in samples]) if samples else np.zeros(0)
    # the last sample at or before each second (the first one before any)
    k = np.clip(np.searchsorted(ts, np.arange(seconds), side="right") - 1, 0, None)
    for name in names:
        v = np.asarray([s["instances"].get(name, 0) for s in samples], dtype=np.float64)
        tl[f"instances_{name}"] = v[k] if v.size else np.zeros(seconds)
    for key in ("allocated_gb", "busy_gb"):
        v = np.asarray([s[key] for s in samples], dtype=np.float64)
        tl[key] = v[k] if v.size else np.zeros(seconds)
    return tl


def cold_flags(result: Any, samples: list[dict]) -> np.ndarray:
    """A request met a cold start when a sample taken while it was in flight
    saw an instance starting."""
    ts = np.asarray([s["t"] for s in samples if s["starting"] > 0])
    if ts.size == 0:
        return np.zeros(result.arrival.size, bool)
    lo = np.searchsorted(ts, result.send, side="left")
    hi = np.searchsorted(ts, result.send + np.nan_to_num(result.latency), side="right")
    return hi > lo


def live_dollars(result: Any, status: dict, prices: dict, requests_n: int) -> dict:
    """Serverless prices applied to the live executions: per execution one
    memory invocation billed the seconds it held memory instances
    (``aggregate_ms``) and one compute invocation billed its ``update_ms``, as
    the simulator bills its two pools; where the gateway did not report them,
    each is billed the execution's seconds (latency minus buffer wait)."""
    sizes: dict[str, tuple[float, float]] = {}
    for inst in status.get("instances", []):
        sizes[inst["spec"]["kind"]] = (inst["spec"]["memory_mb"], inst["spec"]["vcpus"])
    if not {"memory", "compute"} <= set(sizes):
        return {}
    ok = np.flatnonzero(result.status == 200)
    if ok.size == 0:
        return {}
    # one row per execution: the first answered request that names it
    keys = np.asarray([result.execution[i] or f"r{i}" for i in ok])
    _, first = np.unique(keys, return_index=True)
    rows = ok[first]
    whole = result.latency[rows] - np.nan_to_num(result.buffer_wait[rows])
    stage = {"memory": result.aggregate[rows], "compute": result.update[rows]}
    durations = [np.where(np.isfinite(stage[k]), stage[k], whole) for k in ("memory", "compute")]
    (m_mb, m_cpu), (c_mb, c_cpu) = sizes["memory"], sizes["compute"]
    n = rows.size
    return dollars(
        prices, serverful=False,
        durations_s=np.concatenate(durations),
        memory_mb=np.concatenate([np.full(n, m_mb), np.full(n, c_mb)]),
        vcpus=np.concatenate([np.full(n, m_cpu), np.full(n, c_cpu)]),
        duration_s=0.0, peak_vcpus=0.0, peak_gib=0.0, requests=requests_n,
    )  # fmt: skip


@dataclass
class LiveRun:
    """A finished live replay: the summary and what the run directory is made of."""

    summary: dict
    result: Any
    samples: list[dict]
    status: dict
    full: Any = None  # the whole replay, warm-up included (times from its start)
    failed_samples: int = 0  # status polls that gave no sample


def replay_live(
    url: str,
    model: str,
    arrivals: np.ndarray,
    targets: np.ndarray,
    *,
    slo_s: float,
    prices: dict,
    duration_s: float,
    senders: int = 64,
    timeout_s: float = 30.0,
    progress: bool = False,
    warmup_s: float = 0.0,
    updates: UpdateSender | None = None,
) -> LiveRun:
    """Replay open loop with the status sampler; metering over the replay.

    The first ``warmup_s`` seconds are replayed but not measured: the summary,
    the metering window and the run directory start at the end of the warm-up
    (times shifted so it is 0). ``updates``: batches of graph updates sent
    beside the requests (the summary's ``updates``: acks and their latency)."""
    url = url.rstrip("/")
    t_start = time.monotonic()
    with StatusSampler(url, t_start) as sampler:
        with updates if updates is not None else contextlib.nullcontext():
            result = replay(url, model, arrivals, targets, max_senders=senders,
                            timeout_s=timeout_s, progress=progress)  # fmt: skip
        time.sleep(1.0)  # one more sample after the last answer
    full, result = result, result.after(warmup_s)
    # sample times from the first measured send, the metering window's start
    # (the sampler started a little before the sender)
    lead = full.start_monotonic - t_start
    samples = [{**s, "t": s["t"] - lead - warmup_s} for s in sampler.samples]
    # metering from the first measured send to the last answer
    w0 = result.start_monotonic
    n = int(result.arrival.size)
    last = result.last_answer_s
    status = requests.get(f"{url}/v1/status", params={"window_start": w0,
                          "window_end": w0 + last}, timeout=30).json()  # fmt: skip
    metering = status["metering"]["total"]
    ok = result.status == 200
    lat = result.latency[ok]
    q = np.percentile(lat, [50, 99]) * 1e3 if lat.size else np.zeros(2)
    summary = {
        "model": model,
        "url": url,
        "requests": n,
        "ok": int(ok.sum()),
        "errors": int(n - ok.sum()),
        "duration_s": float(duration_s) - warmup_s,
        "warmup_s": float(warmup_s),
        "slo_s": slo_s,
        "p50_ms": float(q[0]),
        "p99_ms": float(q[1]),
        "mean_ms": float(lat.mean() * 1e3) if lat.size else 0.0,
        "slo_violations": int((lat > slo_s).sum() + (n - ok.sum())),
        "gb_s": float(metering["allocated_gb_s"]),
        "busy_gb_s": float(metering.get("busy_gb_s", 0.0)),
        "vcpu_s": float(metering["vcpu_s"]),
        "gb_s_per_request": float(metering["allocated_gb_s"]) / max(n, 1),
        "cold_starts": int(metering.get("cold_starts", 0)),
        "mean_sharing_degree": float(np.nanmean(result.sharing)) if ok.any() else 0.0,
        "max_send_lag_s": float(np.nanmax(result.send - result.arrival)) if n else 0.0,
        "dollars": live_dollars(result, status, prices, n),
        "error_examples": result.error_messages[:3],
    }
    if updates is not None:
        summary["updates"] = updates.summary()
    return LiveRun(summary, result, samples, status, full, sampler.failed)


def write_live(out: Path, run: LiveRun, duration_s: float, sim_runs: dict | None = None) -> None:
    """``requests.csv``, ``timeline.csv``, ``summary.json`` and the plots."""
    result, summary = run.result, run.summary
    out.mkdir(parents=True, exist_ok=True)
    end = result.last_answer_s
    seconds = max(int(np.ceil(max(duration_s, end))), 1)
    tl = timeline_from(result, run.samples, seconds)
    write_timeline(out / "timeline.csv", tl)
    write_requests(
        out / "requests.csv",
        {"arrival_s": result.arrival, "send_s": result.send, "latency_s": result.latency,
         "status": result.status, "buffer_wait_s": result.buffer_wait,
         "sharing_degree": result.sharing, "execution": np.asarray(result.execution),
         "cold_start": cold_flags(result, run.samples).astype(int)},
    )  # fmt: skip
    ok = result.status == 200
    latencies = {"live": result.latency[ok]}
    costs = {"live": summary["dollars"]}
    for name, r in (sim_runs or {}).items():
        latencies[f"sim {name}"] = r.latency[~r.dropped]
        costs[f"sim {name}"] = summary["simulated"]["policies"][name]["dollars"]
    plots.latency_cdf(out / "latency_cdf.png", latencies, summary["slo_s"])
    plots.rate_and_instances(out / "rate_instances.png", {"live": tl})
    plots.memory_over_time(out / "memory.png", {"live": tl})
    plots.cost_per_policy(out / "cost.png", costs)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def run_replay(trace_name: str, args: argparse.Namespace) -> dict:
    """``gnn-faas replay``: :func:`replay_window`, then the run directory (``--out``)."""
    run, sim_runs, measured_s = replay_window(trace_name, args)
    if args.out:
        write_live(Path(args.out), run, measured_s, sim_runs)
        run.summary["out"] = str(args.out)
    return run.summary


def replay_window(trace_name: str, args: argparse.Namespace) -> tuple[LiveRun, dict, float]:
    """The trace window replayed live against ``args.url`` and, with
    ``args.predict``, simulated: ``(live run, simulated runs by policy, measured
    seconds)``; the simulated figures are in the live run's summary too."""
    url = args.url.rstrip("/")
    meta = model_metadata(url, args.model)
    params = meta.get("parameters", {})
    graph_name = params.get("graph", args.model)
    slo = float(args.slo or params.get("slo_s", 0.3))
    mode = params.get("mode", "graph_sharing")
    trace = load_trace(trace_name, args)
    graph, _ = open_prepared_graph(graph_name, args.store)
    if int(params.get("num_nodes", graph.num_nodes)) != graph.num_nodes:
        raise InvalidRequest(f"graph {graph_name!r} in the store differs from the served one")
    targets = map_targets(request_order(graph), trace.requests)
    prices = load_prices(args.prices)
    updates, stream = update_sender(args, url, graph_name, graph, trace)
    run = replay_live(url, args.model, trace.arrivals, targets, slo_s=slo, prices=prices,
                      duration_s=trace.duration_s, senders=args.senders,
                      timeout_s=args.timeout, progress=not args.no_progress,
                      warmup_s=trace.warmup_s, updates=updates)  # fmt: skip
    run.summary.update(trace=trace_name, graph=graph_name, mode=mode)
    if updates is not None:
        run.summary["updates"].update(stream)
    fanouts = served_fanouts(params)
    storage_model = live_storage(run, graph, int(params.get("num_layers", 2)), mode, prices,
                                 trace.measured_s, fanouts)  # fmt: skip
    sim_runs: dict = {}
    if args.predict:
        warm = (run.full, targets) if getattr(args, "fit_warmup", False) else None
        run.summary["simulated"], sim_runs = predict(trace, graph, args, slo, prices, mode, warm,
                                                     fanouts)  # fmt: skip
        sim = run.summary["simulated"]["policies"]
        for name, st in storage_per_policy(sim, storage_model, prices, trace.measured_s).items():
            sim[name]["storage"] = st
    return run, sim_runs, trace.measured_s


def update_sender(args: argparse.Namespace, url: str, graph_name: str, graph: Any,
                  trace: Any) -> tuple[UpdateSender | None, dict]:  # fmt: skip
    """``--updates`` as batches due over the measured window (after the
    warm-up), sent with ``--token`` (or ``GNN_FAAS_WRITE_TOKEN``)."""
    options = update_options(args)
    if options is None:
        return None, {}
    name, rate, batch = options
    token = getattr(args, "token", None) or os.environ.get("GNN_FAAS_WRITE_TOKEN")
    if not token:
        raise InvalidRequest("--updates needs a write token: --token or GNN_FAAS_WRITE_TOKEN")
    rate, batches = window_batches(update_stream(name, graph), rate=rate, batch=batch,
                                   start_s=trace.warmup_s, duration_s=trace.measured_s)  # fmt: skip
    if not batches:
        raise InvalidRequest(f"no batch of {batch} edges of {name} falls within the window")
    sender = UpdateSender(url, graph_name, batches, token, timeout_s=args.timeout)
    return sender, {"stream": name, "rate_edges_per_s": rate, "batch": batch}


def served_fanouts(params: dict) -> tuple[int, ...] | None:
    """The served model's per-hop sample from its metadata (``None``: every
    neighbour, also when every entry is ``-1``)."""
    fanouts = params.get("fanouts")
    if not fanouts or not any(int(f) >= 0 for f in fanouts):
        return None
    return tuple(int(f) for f in fanouts)


def live_storage(run: LiveRun, graph: Any, hops: int, mode: str, prices: dict,
                 duration_s: float, fanouts: tuple[int, ...] | None = None) -> Any:  # fmt: skip
    """The live run's storage requests and dollars (``storage`` in its summary),
    modelled as the simulator's policy for the mode: one fetch per execution
    (:func:`gnn_faas.traces.cost.policy_storage_requests`, rows per fetch
    those of a single request, sampled with the served model's ``fanouts``);
    returns the per-fetch model."""
    model = measure_fetch_requests(graph, hops, request_order(graph), fanouts=fanouts)
    r = run.result
    ok = np.flatnonzero(r.status == 200)
    executions = np.unique([r.execution[i] or f"r{i}" for i in ok]).size
    live = {"requests": run.summary["requests"], "executions": executions,
            "cold_starts": run.summary["cold_starts"]}  # fmt: skip
    name = MODE_POLICY.get(mode, "gnn_faas")
    run.summary["storage"] = storage_per_policy({name: live}, model, prices, duration_s)[name]
    return model


def warmup_calibration(cal: Any, graph: Any, full: Any, targets: np.ndarray,
                       warmup_s: float) -> Any:  # fmt: skip
    """``cal`` with its execution-time fit and memory share measured again on the
    executions of the warm-up's second half (its first half holds the stack's
    start-up), so the prediction runs at the speed the machine has now; the
    measured window is held out of the fit."""
    mask = (full.arrival >= warmup_s / 2) & (full.arrival < warmup_s)
    ok = mask & (full.status == 200)
    sets = khop_sets(graph, np.unique(targets[ok]), cal.hops)
    executions = replay_executions(full, targets, sets, mask)
    if len(executions) < 10:
        raise InvalidRequest(
            f"--fit-warmup: only {len(executions)} executions in the warm-up's second half "
            "(at least 10 are needed): lengthen --warmup"
        )
    share = share_of(full.aggregate[ok], full.update[ok])
    return cal.refit(executions, share, f"warm-up of the live replay ({warmup_s:g} s)")


def predict(trace, graph, args, slo, prices, mode, warm=None,
            fanouts=None) -> tuple[dict, dict]:  # fmt: skip
    """The simulator on the same window: the policy modelling the live mode
    first (``prediction``), then the rest for the cost comparison. ``warm``:
    ``(whole replay, targets)`` to refit the profile on the warm-up first;
    ``fanouts``: the served model's sample (the requests' k-hop sets)."""
    cal = (
        Calibration.load(args.calibration) if args.calibration else Calibration.bundled(graph.name)
    )
    if warm is not None:
        cal = warmup_calibration(cal, graph, *warm, trace.warmup_s)
    setup = setup_simulation(trace, graph, cal, slo, fanouts=fanouts)
    main = MODE_POLICY.get(mode, "gnn_faas")
    names = [main] + [p for p in parse_policies(args.policies) if p != main]
    runs = {n: r.after(trace.warmup_s) for n, r in simulate(setup, names).items()}
    policies = {n: r.summary(slo, prices, trace.measured_s) for n, r in runs.items()}
    profile = {"measured_at": cal.meta.get("measured_at", ""), "refit": cal.meta.get("refit"),
               "exec_intercept_s": cal.exec_intercept_s, "exec_per_row_s": cal.exec_per_row_s,
               "memory_share": cal.memory_share}  # fmt: skip
    return {"prediction": main, "policies": policies, "calibration": profile}, runs

"""``gnn-faas bench e2e``: the same real request stream served three ways.

Arrivals come from the real Twitter trace scaled to ``--rps`` (its busiest
window of ``--duration`` seconds, burstiness kept); targets follow the graph's
real request order. Each mode runs a fresh stack (``gnn-faas up`` with its own
local platform and function processes):

- ``gnn_faas``: graph-sharing buffers, merged execution, adaptive cache,
  load-aware queueing;
- ``request_centric`` (AWSGNN): no buffers, no cache, every request runs on its
  own instances, a new instance whenever none is idle, memory functions sized
  for the largest request of the stream (as FaaS-GNN sized its baselines);
- ``no_sharing``: buffers, but each request aggregated on its own.

Instances are warmed before the stream (one of each function), and metering
covers the first request to the last response; each mode also reports the
GB-s its warm instances alone cost over that window (its floor, see
:func:`warm_floor_gb_s`). Each mode reports the median
of its answers' ``breakdown_ms`` (parse, k-hop fetch, buffer, each kind of
function call's transport, (de)serialisation and work). With several ``--rps``
values the stacks run once per rate and the JSON is
``{"inprocess_pyg_p50_ms", "rates": {rate: {mode: figures}}}``; the in-process
PyG figure is the same requests' k-hop fetch and forward pass in this process
(the floor a serving path is measured against). The replay itself is
``gnn-faas replay``'s (:func:`gnn_faas.traces.live.replay_live`): open loop,
bounded sender pool, status sampling; with ``--out DIR`` each mode's run
directory (``requests.csv``, ``timeline.csv``, ``summary.json``, plots) is
written under ``DIR/<mode>``.
Requests shed by admission
control (503 + Retry-After) are reported apart (``shed``, the gateway's own
count over the stream), not as errors or SLO violations; ``gateway_slo_violations``
is the gateway's own count of late answers, beside the client-side one.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from gnn_faas.bench.store_proxy import add_store_arguments, store_access, store_fields
from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.checkpoint import load_config, load_state
from gnn_faas.paths import default_store
from gnn_faas.scheduler.sizing.function_memory import round_memory_mb
from gnn_faas.stack import Stack, prepared_model
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.live import replay_live, write_live
from gnn_faas.traces.plots import frontier
from gnn_faas.traces.replay import ReplayResult, replay
from gnn_faas.traces.run import FRONTIER, frontier_point
from gnn_faas.traces.twitter import arrivals

MODES = {"gnn_faas": "graph_sharing", "request_centric": "request_centric",
         "no_sharing": "no_sharing"}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", help="graph (and dataset) name")
    p.add_argument("--trace", default="twitter", choices=["twitter"], help="arrival trace")
    p.add_argument("--rps", default="20", help="mean requests per second (comma-separated: each)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of trace to replay")
    p.add_argument("--slo", type=float, default=0.3, help="SLO in seconds (λGrapher: 0.3)")
    add_store_arguments(p)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of modes")
    p.add_argument("--arch", default="gcn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-mb", type=int, default=256, help="gnn_faas memory function size")
    p.add_argument("--compute-mb", type=int, default=512, help="compute function size")
    p.add_argument("--max-instances", type=int, default=4, help="per function (gnn_faas)")
    p.add_argument("--baseline-max-instances", type=int, default=8, help="request_centric cap")
    p.add_argument("--out", default=None, help="write each mode's run directory under DIR/<mode>")
    p.add_argument("--frontier", action="store_true",
                   help="sweep gnn_faas's objective (cost ... latency) at one rate beside the "
                        "baselines (frontier.png under --out)")  # fmt: skip


def largest_request_mb(store: str, graph: str, targets: np.ndarray, layers: int, dim: int) -> int:
    """Memory function size for the largest request (FaaS-GNN's baseline sizing)."""

    fetcher = KHopFetcher(open_graph(store, graph))
    worst = 0
    for t in np.unique(targets):
        cg = fetcher.fetch([int(t)], layers)
        rows = cg.layer_sizes[0] + sum(cg.layer_sizes[1:])
        worst = max(worst, rows * dim * 4 + cg.indices.size * 16)
    return round_memory_mb(96 * 2**20 + worst)


def parse_rates(spec) -> list[float]:
    try:
        rates = [float(r) for r in str(spec).split(",") if r.strip()]
    except ValueError:
        raise InvalidRequest(f"--rps takes numbers separated by commas, not {spec!r}") from None
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise InvalidRequest(f"--rps needs positive rates, got {spec!r}")
    return rates


def inprocess_pyg_p50_ms(graph, ckpt, targets: np.ndarray, n: int = 200) -> float:
    """Median time of one request answered in process by PyG: its k-hop fetch,
    feature read and the model's forward pass on the sampled subgraph, on one
    torch thread (a busy machine's other threads would make torch's spin-waits
    dominate), after a few untimed requests warm it up."""
    import time

    import torch  # lazily: the bench CLI and the other benchmarks start without torch

    from gnn_faas.functions.pyg_models import PygGNN, cg_edge_index  # imports torch

    config = load_config(ckpt)
    model = PygGNN(config)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in load_state(ckpt).items()})
    model.eval()
    fetcher = KHopFetcher(graph)
    times = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    warm = [int(t) for t in targets[:5].tolist()]
    with torch.no_grad():
        for i, t in enumerate(warm + targets[:n].tolist()):
            t0 = time.perf_counter()
            cg = fetcher.fetch([int(t)], config.num_layers, fanouts=config.fanouts)
            x = torch.from_numpy(fetcher.read_features(cg.input_nodes))
            model(x, cg_edge_index(cg))[: cg.layer_sizes[-1]].numpy()
            if i >= len(warm):
                times.append(time.perf_counter() - t0)
    torch.set_num_threads(threads)
    return float(np.median(times) * 1e3)


def warm_floor_gb_s(platform: dict, window_s: float) -> float:
    """GB-s of keeping ``min_instances`` of each function warm for ``window_s``:

        floor = min_instances · (m_memory + m_compute) / 1024 · window_s

    (``m``: the functions' sizes in MB). Every mode keeps that many instances
    alive however few requests come, so below the rate at which they are
    busy, ``floor / requests`` is the least GB-s per request a mode can be
    metered, and the ratio of two modes' figures cannot fall under the ratio
    of their floors to what the other mode was metered."""
    gb = (platform["memory_function_mb"] + platform["compute_function_mb"]) / 1024
    return int(platform.get("min_instances", 1)) * gb * max(float(window_s), 0.0)


def summarise(
    result: ReplayResult, slo_s: float, metering: dict, platform: dict | None = None
) -> dict:
    """Latency, SLO, sharing and resource figures of one replay.

    ``sharing_degree``: mean over the closed buffers the replayed requests were
    in; ``aggregated_rows_per_request``: rows aggregated (each buffer's once)
    over requests; GB-s and vCPU-s: metered between the first request and the
    last response, over requests; ``warm_floor_gb_s_per_request``: what the
    mode's warm instances alone cost over that window (:func:`warm_floor_gb_s`),
    over requests (with the stack's ``platform`` config).
    """
    out = result.summary(slo_s)
    executions: dict = {}  # each execution's rows count once, however many it served
    buffers: dict = {}
    for p in result.parameters:
        executions[p.get("execution")] = p.get("aggregated_rows", 0)
        if "buffer_id" in p:
            buffers[(p["buffer_id"], p.get("closed_at"))] = p.get("sharing_degree", 0.0)
    n = max(result.ok, 1)
    sharing = float(np.mean(list(buffers.values()))) if buffers else 0.0
    rows = sum(executions.values())
    out.update(
        sharing_degree=sharing,
        buffers=len(buffers),
        aggregated_rows_per_request=rows / n,
        gb_s_per_request=metering["allocated_gb_s"] / n,
        vcpu_s_per_request=metering["vcpu_s"] / n,
        busy_gb_s_per_request=metering.get("busy_gb_s", 0.0) / n,
        cold_starts=int(metering.get("cold_starts", 0)),
        instances=int(metering.get("instances", 0)),
        breakdown_ms=median_breakdown(result.parameters),
    )
    if platform is not None:
        window = result.last_answer_s  # the metering window
        out["warm_floor_gb_s_per_request"] = warm_floor_gb_s(platform, window) / n
    return out


def median_breakdown(parameters: list[dict]) -> dict:
    """Per step of the answers' ``breakdown_ms`` (a number, or per kind of
    function call ``calls``/``transport_ms``/``serde_ms``/``work_ms``), its
    median over the answers that report it."""
    steps: dict = {}
    for p in parameters:
        for key, value in p.get("breakdown_ms", {}).items():
            if isinstance(value, dict):
                for k, v in value.items():
                    steps.setdefault((key, k), []).append(v)
            else:
                steps.setdefault((key, None), []).append(value)
    out: dict = {}
    for (key, sub), values in sorted(steps.items()):
        m = float(np.median(values))
        if sub is None:
            out[key] = m
        else:
            out.setdefault(key, {})[sub] = m
    return out


def run(args: argparse.Namespace) -> dict:
    """One rate: the figures per mode (the original shape); several: per rate."""
    rates = parse_rates(args.rps)
    if getattr(args, "frontier", False):
        if len(rates) != 1:
            raise InvalidRequest("--frontier sweeps the objective at one --rps")
        return run_frontier(args, rates[0])
    if len(rates) == 1:
        return {**run_rate(args, rates[0], with_floor=True), **store_fields_of(args)}
    out: dict = {"rates": {}, **store_fields_of(args)}
    for rate in rates:
        res = run_rate(args, rate, with_floor="inprocess_pyg_p50_ms" not in out)
        out.setdefault("inprocess_pyg_p50_ms", res.pop("inprocess_pyg_p50_ms", None))
        key = f"{rate:g}"
        out["rates"][key] = {m: res[m] for m in MODES if m in res}
        out.setdefault("graph", res["graph"])
        out.setdefault("duration_s", res["duration_s"])
        out.setdefault("slo_s", res["slo_s"])
    return out


def store_fields_of(args: argparse.Namespace) -> dict:
    """The store a run used, as its JSON names it."""
    return store_fields(args.store or default_store(), getattr(args, "store_rtt_ms", 0.0))


def run_frontier(args: argparse.Namespace, rps: float) -> dict:
    """gnn_faas under each objective of the simulator's frontier, the baselines
    once, at one rate: JSON points and, with ``--out``, ``frontier.png``."""

    others = [m.strip() for m in args.modes.split(",") if m.strip() and m.strip() != "gnn_faas"]
    args_b = argparse.Namespace(**{**vars(args), "modes": ",".join(others)})
    base = run_rate(args_b, rps, with_floor=True) if others else {}
    points = []
    for label, objective, slack in FRONTIER:
        args_g = argparse.Namespace(**{**vars(args), "modes": "gnn_faas"})
        res = run_rate(args_g, rps, with_floor=False, objective=(objective, slack))
        points.append(frontier_point(label, objective, slack, res["gnn_faas"]))
    keys = ("mean_ms", "p50_ms", "p99_ms", "gb_s_per_request", "slo_violations")
    out = {
        "rps": rps,
        "inprocess_pyg_p50_ms": base.get("inprocess_pyg_p50_ms"),
        "gnn_faas": points,
        "baselines": {m: {k: base[m][k] for k in keys} for m in others},
    }
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        frontier(Path(args.out) / "frontier.png", points, out["baselines"])
        out["png"] = str(Path(args.out) / "frontier.png")
    return out


def run_rate(
    args: argparse.Namespace,
    rps: float,
    with_floor: bool,
    objective: tuple[str, float] | None = None,
) -> dict:
    """Every mode at ``rps``; ``objective``: gnn_faas's buffer objective and slack."""

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise InvalidRequest(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    base, graph, ckpt = prepared_model(args.store, args.graph, args.arch, args.slo)
    prices = load_prices()
    times = arrivals(rps, args.duration, seed=args.seed)
    order = graph.read_blob("request_order") if graph.has("request_order") else None
    if order is None or order.size == 0:
        order = np.random.default_rng(args.seed).integers(0, graph.num_nodes, times.size)
    reps = math.ceil(times.size / order.size)
    targets = np.tile(order, reps)[: times.size]
    results: dict = {
        "graph": args.graph,
        "trace": args.trace,
        "rps": rps,
        "duration_s": args.duration,
        "requests": int(times.size),
        "slo_s": args.slo,
    }
    if with_floor:
        results["inprocess_pyg_p50_ms"] = inprocess_pyg_p50_ms(graph, ckpt, targets)
    baseline_mb = largest_request_mb(
        base.store, args.graph, targets, base.models[0].layers, graph.manifest.feature_dim
    )
    for name in modes:
        config = mode_config(args, name, base.store, ckpt, baseline_mb, objective)
        results[name] = run_mode(args, name, config, times, targets, prices, baseline_mb)
    if "gnn_faas" in results and "request_centric" in results:
        g, r = results["gnn_faas"], results["request_centric"]
        results["gb_s_ratio"] = g["gb_s_per_request"] / max(r["gb_s_per_request"], 1e-12)
        # the least gb_s_ratio gnn_faas could reach here: its warm instances alone
        results["warm_floor_gb_s_ratio"] = g["warm_floor_gb_s_per_request"] / max(
            r["gb_s_per_request"], 1e-12
        )
        results["vcpu_s_ratio"] = g["vcpu_s_per_request"] / max(r["vcpu_s_per_request"], 1e-12)
    return results


def mode_config(
    args: argparse.Namespace,
    name: str,
    store: str,
    ckpt: str,
    baseline_mb: int,
    objective: tuple[str, float] | None,
) -> dict:
    """The serving config of one mode: request_centric gets functions sized for
    the largest request (``baseline_mb``) and its own instance cap; gnn_faas
    the buffer ``objective`` when one is given."""
    mode = MODES[name]
    rc = mode == "request_centric"
    config = {
        "store": store,
        "platform": {
            "memory_function_mb": baseline_mb if rc else args.memory_mb,
            "compute_function_mb": args.compute_mb,
            "max_memory_instances": args.baseline_max_instances if rc else args.max_instances,
            "max_compute_instances": args.baseline_max_instances if rc else args.max_instances,
            "min_instances": 1,
        },
        "models": [{
            "name": args.graph, "graph": args.graph, "dataset": args.graph,
            "checkpoint": ckpt, "slo_s": args.slo, "mode": mode,
        }],
    }  # fmt: skip
    if objective is not None and name == "gnn_faas":
        config["models"][0]["buffers"] = {
            "objective": objective[0], "latency_slack": objective[1],
        }  # fmt: skip
    return config


def run_mode(
    args: argparse.Namespace,
    name: str,
    config: dict,
    times: np.ndarray,
    targets: np.ndarray,
    prices: dict,
    baseline_mb: int,
) -> dict:
    """One mode's stack up, warmed, replayed live at ``times``: its summary
    (request_centric's with its functions' ``baseline_mb``)."""
    with (
        store_access(config["store"], getattr(args, "store_rtt_ms", 0.0)) as (uri, env, _),
        Stack({**config, "store": uri}, env=env) as stack,
    ):
        # a few requests outside the measured window warm caches and connections
        replay(stack.url, args.graph, np.linspace(0, 0.5, 5), targets[:5])
        before = stack.status()["models"][0]["totals"]
        run = replay_live(stack.url, args.graph, times, targets, slo_s=args.slo,
                          prices=prices, duration_s=args.duration)  # fmt: skip
    result = run.result
    metering = run.status["metering"]["total"]
    summary = summarise(result, args.slo, metering, config["platform"])
    summary["dollars"] = run.summary["dollars"]
    after = run.status["models"][0]["totals"]
    shed = int(after.get("shed", 0) - before.get("shed", 0))
    # the replay counts every non-200 as an error and a violation: shed ones apart
    summary["shed"] = shed
    summary["errors"] -= shed
    summary["slo_violations"] -= shed
    summary["gateway_slo_violations"] = int(
        after.get("slo_violations", 0) - before.get("slo_violations", 0)
    )
    if args.out:
        write_live(Path(args.out) / name, run, args.duration)
    if MODES[name] == "request_centric":
        summary["memory_function_mb"] = baseline_mb
    if result.error_messages:
        summary["error_examples"] = result.error_messages[:3]
    return summary

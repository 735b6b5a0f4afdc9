"""``gnn-faas simulate calibrate``: measure a :class:`Calibration` on the real system.

It brings the bundle up (``gnn-faas up`` as a subprocess, graph-sharing mode,
the deployment's function sizes and caps), then:

1. reads the platform's metering of the start-up launches: measured
   spawn-to-ready seconds of the memory and compute function instances, and
   the resident memory of the warm memory function's process tree;
2. sends single requests one at a time (targets from the graph's real request
   order) and bursts of 2..32 concurrent requests that share buffers; for each
   execution (the gateway reports its ``execution`` id, ``buffer_wait_ms`` and
   ``latency_ms`` per request) it records the rows aggregated, the union of
   its requests' k-hop sets, and the seconds from the buffer's close to the
   answers (latency minus buffer wait, median over its requests); then the
   same for ``trace_s`` seconds of the busiest Azure 2019 function replayed at
   its own rate (executions under load: contention is part of the figure);
3. fits ``T(rows) = a + b·rows`` on those samples, and takes the memory
   function's share of the instance time from the gateway's ``aggregate_ms``
   and ``update_ms``;
4. times a full download of the graph's blobs from the store (what a
   DGL-serverless or serverful instance does at start-up).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gnn_faas.client import GatewayClient, vertex_request
from gnn_faas.config import ModelServingConfig, ServingConfig
from gnn_faas.errors import InvalidRequest
from gnn_faas.stack import Stack, prepare
from gnn_faas.stack_memory import tree_memory
from gnn_faas.storage.format import open_graph
from gnn_faas.traces import azure2019
from gnn_faas.traces.calibration import Calibration, fit_linear
from gnn_faas.traces.replay import replay
from gnn_faas.traces.request_stream import khop_sets, map_targets, request_order

BURSTS = (2, 4, 8, 16, 32)


def _post(gateway: GatewayClient, model: str, target: int) -> dict:
    """The gateway's parameters of one vertex request's answer."""
    return gateway.infer(model, vertex_request([target])).parameters


def _executions(params: list[dict], targets: list[int], sets: Any) -> list[tuple[int, float]]:
    """``(union rows, seconds)`` per execution of a group of answered requests:
    the median over its requests of latency − buffer wait.

    That time holds the execution's calls on instances (``aggregate_ms +
    update_ms``, the gateway's per-answer figures) and what it waited around
    them (the gateway's own work, queueing between its calls). A wait far
    beyond the group's usual ones, an outlier by Hampel's rule (over the median
    plus three scaled MADs), is a cold start or the queue of a start-up: it is
    capped at that bound, since the simulator cold-starts and queues executions
    itself and a sample holding such a wait would be counted twice (drawn into
    the tail as a slow execution, then queued again). Answers without the
    instance times count as they are."""
    groups: dict[str, list[int]] = {}
    for k, p in enumerate(params):
        groups.setdefault(p.get("execution", str(k)), []).append(k)
    pos = {int(v): j for j, v in enumerate(sets.vertices)}
    whole = np.asarray([p["latency_ms"] - p.get("buffer_wait_ms", 0.0) for p in params]) / 1e3
    held = np.asarray(
        [p.get("aggregate_ms", np.nan) + p.get("update_ms", np.nan) for p in params], np.float64
    ) / 1e3  # fmt: skip
    known = np.isfinite(held)
    if known.any():
        waits = whole[known] - held[known]
        med = float(np.median(waits))
        bound = med + 3 * 1.4826 * float(np.median(np.abs(waits - med)))
        whole = np.where(known, np.minimum(whole, held + max(bound, 0.0)), whole)
    out = []
    for members in groups.values():
        u = np.unique(np.concatenate([sets.set_of(pos[targets[k]]) for k in members]))
        out.append((int(u.size), float(np.median(whole[members]))))
    return out


def memory_share(params: list[dict]) -> float:
    """Median over answers of ``aggregate_ms / (aggregate_ms + update_ms)``."""
    a = np.asarray([p.get("aggregate_ms", np.nan) for p in params], dtype=np.float64)
    u = np.asarray([p.get("update_ms", np.nan) for p in params], dtype=np.float64)
    return share_of(a, u)


def share_of(aggregate: np.ndarray, update: np.ndarray) -> float:
    """Median of ``aggregate / (aggregate + update)`` over the finite pairs."""
    a, u = np.asarray(aggregate, np.float64), np.asarray(update, np.float64)
    ok = np.isfinite(a) & np.isfinite(u) & (a + u > 0)
    if not ok.any():
        raise InvalidRequest("the gateway reported no aggregate_ms/update_ms per request")
    return float(np.median(a[ok] / (a[ok] + u[ok])))


def replay_executions(result: Any, targets: np.ndarray, sets: Any, mask: np.ndarray) -> list:
    """``(union rows, seconds)`` per execution of a replay's answered requests
    in ``mask`` (``sets``: k-hop sets holding their targets)."""
    ok = np.flatnonzero(mask & (result.status == 200))
    params = [{"execution": result.execution[i], "latency_ms": result.latency[i] * 1e3,
               "buffer_wait_ms": result.buffer_wait[i] * 1e3,
               "aggregate_ms": result.aggregate[i] * 1e3,
               "update_ms": result.update[i] * 1e3} for i in ok]  # fmt: skip
    return _executions(params, [int(targets[i]) for i in ok], sets)


def full_fetch_seconds(store: str, graph_name: str, repeats: int = 3) -> tuple[float, float]:
    """``(seconds, MiB)``: median time to read every blob of the graph from the store."""
    times, size = [], 0
    for _ in range(repeats):
        g = open_graph(store, graph_name)
        t0 = time.perf_counter()
        size = 0
        for blob in ("indptr", "indices", "features"):
            if g.has(blob):
                size += g.read_blob(blob).nbytes
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times)), size / 2**20


def deployment(base: ServingConfig, graph: str, slo_s: float, memory_mb: int, compute_mb: int,
               max_instances: int, min_instances: int, keep_alive_s: float) -> dict:  # fmt: skip
    """The stack's config: one graph-sharing model with the deployment's sizes and caps.

    Admission control is off. It sheds (503) a request whose predicted latency
    exceeds ``admission_headroom · SLO``: under the bursts and the trace that
    is exactly the slow, loaded executions, which would then be missing from
    the samples (a replay keeps only answered requests) and bias the fitted
    service time low, or fail the calibration (a single or burst request that
    is not answered stops it). The simulator models no admission either."""
    return {
        "store": base.store,
        "gateway": {"admission": False},
        "platform": {
            "memory_function_mb": memory_mb,
            "compute_function_mb": compute_mb,
            "max_memory_instances": max_instances,
            "max_compute_instances": max_instances,
            "min_instances": min_instances,
            "keep_alive_s": keep_alive_s,
        },
        "models": [{"name": graph, "graph": graph, "dataset": graph,
                    "checkpoint": str(base.checkpoint_dir(base.models[0])),
                    "slo_s": slo_s, "mode": "graph_sharing"}],
    }  # fmt: skip


def startup_figures(stack: Stack) -> tuple[dict[str, list[float]], list[float]]:
    """``(cold starts by kind, memory functions' RSS MiB)`` of the start-up launches,
    from the platform's metering and the warm memory function's process tree."""
    cold: dict[str, list[float]] = {"memory": [], "compute": []}
    rss = []
    for inst in stack.status()["instances"]:
        kind = inst["spec"]["kind"]
        if inst.get("cold_start_s") is not None and kind in cold:
            cold[kind].append(float(inst["cold_start_s"]))
        if kind == "memory" and inst.get("pid"):
            rss.append(tree_memory(int(inst["pid"]))[0] / 2**20)
    if not cold["memory"] or not cold["compute"]:
        raise InvalidRequest("the stack reported no measured cold starts")
    return cold, rss


def single_and_burst_executions(
    stack: Stack, gateway: GatewayClient, graph: str, targets: list[int], sets: Any, singles: int,
    repeats: int,
) -> tuple[list, list[dict], int]:  # fmt: skip
    """``(samples, answers' parameters, targets used)``: ``singles`` requests one at
    a time, then ``repeats`` rounds of bursts of :data:`BURSTS` concurrent ones."""
    samples: list[tuple[int, float]] = []
    stages: list[dict] = []
    for _ in range(3):  # warm connections and caches, not recorded
        _post(gateway, graph, targets[0])
    k = 0
    for _ in range(singles):
        stages.append(_post(gateway, graph, targets[k]))
        samples += _executions(stages[-1:], [targets[k]], sets)
        k += 1
    with ThreadPoolExecutor(max_workers=max(BURSTS)) as pool:
        for _ in range(repeats):
            for b in BURSTS:
                ts = targets[k : k + b]
                k += b
                params = list(pool.map(lambda t: _post(gateway, graph, t), ts))
                samples += _executions(params, ts, sets)
                stages += params
                time.sleep(0.3)
    return samples, stages, k


def trace_executions(
    stack: Stack, g: Any, graph: str, order: np.ndarray, offset: int, layers: int, trace_s: float
) -> tuple[list, list[dict]]:
    """Executions under a real arrival pattern: ``trace_s`` seconds of the busiest
    Azure 2019 function at its own rate, so contention is part of the measurement."""
    tr = azure2019.load(rank=0, start_minute=60, minutes=1).window(0.0, trace_s)
    tt = map_targets(order, tr.requests, offset=offset)
    extra_sets = khop_sets(g, np.unique(tt), layers)
    res = replay(stack.url, graph, tr.arrivals, tt)
    return replay_executions(res, tt, extra_sets, np.ones(tr.requests, bool)), res.parameters


def calibrate(
    *,
    graph: str = "bitcoin-otc",
    store: str = "",
    slo_s: float = 0.3,
    memory_mb: int = 256,
    compute_mb: int = 512,
    max_instances: int = 4,
    min_instances: int = 1,
    keep_alive_s: float = 600.0,
    singles: int = 40,
    repeats: int = 3,
    trace_s: float = 20.0,
    log=print,
) -> Calibration:
    base = ServingConfig(
        store=store,
        models=(ModelServingConfig(name=graph, graph=graph, dataset=graph, slo_s=slo_s),),
    )
    prepare(base, log=log)
    g = open_graph(base.store, graph)
    layers = base.models[0].layers
    order = request_order(g)
    need = singles + sum(BURSTS) * repeats
    targets_all = [int(v) for v in order[:need]]
    sets = khop_sets(g, np.unique(order[:need]), layers)
    config = deployment(base, graph, slo_s, memory_mb, compute_mb, max_instances,
                        min_instances, keep_alive_s)  # fmt: skip
    with Stack(config) as stack, GatewayClient(stack.url, timeout_s=60) as gateway:
        cold, rss = startup_figures(stack)
        log(f"cold starts: {cold}; memory function RSS {rss} MiB")
        samples, stages, k = single_and_burst_executions(
            stack, gateway, graph, targets_all, sets, singles, repeats
        )
        if trace_s > 0:
            more, params = trace_executions(stack, g, graph, order, k, layers, trace_s)
            samples += more
            stages += params
        log(f"{len(samples)} executions measured")
    share = memory_share(stages)
    log(f"memory share of instance time: {share:.3f}")
    a, b = fit_linear(*np.asarray(samples).T)
    fetch_s, graph_mb = full_fetch_seconds(base.store, graph)
    manifest = g.manifest
    dim = int(manifest.feature_dim)
    # a row of a request's computation graph: its feature row, its hidden rows
    # (one per layer) and its CSR entries (int32 index + int64 indptr share)
    row_bytes = dim * 4 * (1 + layers) + 12 * manifest.num_edges / max(manifest.num_nodes, 1)
    return Calibration(
        graph=graph,
        hops=layers,
        slo_s=slo_s,
        exec_intercept_s=a,
        exec_per_row_s=b,
        cold_start_memory_s=float(statistics.median(cold["memory"])),
        cold_start_compute_s=float(statistics.median(cold["compute"])),
        memory_function_mb=float(memory_mb),
        compute_function_mb=float(compute_mb),
        memory_vcpus=1.0,
        compute_vcpus=1.0,
        keep_alive_s=keep_alive_s,
        max_instances=max_instances,
        min_instances=min_instances,
        runtime_mb=float(statistics.median(rss)) if rss else float(memory_mb),
        row_bytes=float(row_bytes),
        graph_mb=float(graph_mb),
        full_fetch_s=fetch_s,
        memory_share=share,
        samples=tuple(samples),
        meta={
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": f"gnn-faas simulate calibrate --graph {graph} --memory-mb {memory_mb} "
            f"--compute-mb {compute_mb} --max-instances {max_instances} --out FILE",
            "platform": "local",
        },
    )

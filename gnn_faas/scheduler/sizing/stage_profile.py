"""Latency profiles of a model's real stages on this machine (λGrapher 3.5).

Each layer's Aggregate (numpy, the memory function's work) and Update (torch,
the compute function's) run on a real batch of requests, timed with 1 and 2
threads (median of ``repeats`` after a warm-up). Those two points fix each
stage's serial fraction ``s`` (Amdahl: ``T(c) = T(1)·(s + (1 − s)/c)`` for
``c >= 1``, ``s = clip(2·T(2)/T(1) − 1, 0, 1)``); below one core a CPU quota
stretches time as ``T(1)/c``. The memory of each stage comes from the memory
formulas (:mod:`gnn_faas.scheduler.sizing.function_memory`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gnn_faas.functions.aggregate import aggregate
from gnn_faas.functions.checkpoint import load_config
from gnn_faas.functions.layer_plan import LayerStep, ModelPlan
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
from gnn_faas.scheduler.sizing.function_sizing import core_grid
from gnn_faas.scheduler.sizing.latency_profile import LatencyProfile
from gnn_faas.storage.computation_graph import Block, ComputationGraph
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle


@dataclass
class StageProfile:
    """What profiling found: the latency profile over the core grid, destination
    rows and memory (MB) per stage (``aggregate-L``, ``update-L``), and the
    profiled batch's computation graph."""

    profile: LatencyProfile
    rows: dict[str, int]
    memory_mb: dict[str, int]
    cg: ComputationGraph


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _aggregate_inputs(
    step: LayerStep, update: UpdateModel, block: Block, h: np.ndarray, cg: ComputationGraph
) -> tuple[np.ndarray, dict]:
    """The rows and extra tensors a layer's Aggregate takes (``pre`` applied)."""
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
    return x, extras


def _stage_memory_mb(kind: str, step: LayerStep, block: Block, weight_bytes: int) -> int:
    n = block.num_dst
    if kind == "aggregate":
        need = memory_function_bytes(
            block.num_src, block.num_edges, n, step.src_dim * 4, step.agg_dim * 4,
            MEMORY_RUNTIME_MB * MIB,
        )  # fmt: skip
    else:
        act = update_activation_row_bytes(step.agg_dim, step.out_dim)
        need = compute_function_bytes(weight_bytes, n, act, COMPUTE_RUNTIME_MB * MIB)
    return round_memory_mb(int(need))


def _add_over_grid(profile: LatencyProfile, name: str, rows: int, t1: float, t2: float,
                   grid: np.ndarray) -> None:  # fmt: skip
    """Amdahl's law through the 1- and 2-thread times, over the core grid."""
    serial = float(np.clip(2 * t2 / t1 - 1, 0.0, 1.0))
    for c in grid:
        t = t1 / c if c < 1 else t1 * (serial + (1 - serial) / c)
        profile.add(name, float(c), rows, t)


def profile_stages(
    graph: GraphHandle,
    model_dir: str,
    targets: np.ndarray,
    repeats: int,
    max_cores: float,
    fanouts: tuple[int, ...] | None = None,
) -> StageProfile:
    """Profile every stage of the checkpoint in ``model_dir`` on the batch
    ``targets``, their neighbourhoods sampled with ``fanouts`` (as a serving
    config's ``fanouts`` samples them; ``None``: the checkpoint's, ``-1``
    entries: every neighbour)."""
    cfg = load_config(model_dir)
    plan = ModelPlan.from_config(cfg)
    update = UpdateModel.load(model_dir, device="cpu")
    fetcher = KHopFetcher(graph)
    fanouts = cfg.fanouts if fanouts is None else fanouts
    cg = fetcher.fetch(targets, cfg.num_layers, fanouts=fanouts, degrees=True)
    out = StageProfile(LatencyProfile(), {}, {}, cg)
    weight_bytes = sum(t.numel() * 4 for t in update.w.values())
    h = fetcher.read_features(cg.input_nodes)
    grid = core_grid(max_cores)
    for step in plan.steps:
        block = cg.block(step.layer)
        x, extras = _aggregate_inputs(step, update, block, h, cg)

        def agg(block=block, x=x, extras=extras, step=step):
            return aggregate(step.op, block, x, eps=step.eps, **extras)

        agg_out = agg()
        root = x[: block.num_dst] if step.return_root else None

        def upd(agg_out=agg_out, root=root, step=step):
            return update.post(step.layer, agg_out, root)

        timings = {}
        for threads in (1, 2):
            with threadpool_limits(threads):
                timings[("aggregate", threads)] = median_time(agg, repeats)
            torch.set_num_threads(threads)
            timings[("update", threads)] = median_time(upd, repeats)
        for kind in ("aggregate", "update"):
            name = f"{kind}-{step.layer}"
            _add_over_grid(out.profile, name, block.num_dst, timings[(kind, 1)],
                           timings[(kind, 2)], grid)  # fmt: skip
            out.rows[name] = block.num_dst
            out.memory_mb[name] = _stage_memory_mb(kind, step, block, weight_bytes)
        h = update.post(step.layer, agg_out, root)  # next layer's input rows
    return out

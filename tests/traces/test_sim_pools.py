"""The simulator's fused pools decide as the gateway's policy objects do.

:class:`~gnn_faas.traces.sim_pools.FusedPool` (LoadAwarePolicy's rule written
into the pool) and :meth:`BufferPoolState.submit_alone` (an arrival the gate
dispatches alone, counted without objects) are the simulator's fast path;
``fused=False`` runs the objects themselves (``ObjectPool`` around
:class:`LoadAwarePolicy`, every arrival through :meth:`BufferPoolState.submit`).
On random bursty streams, under every rule they implement (FaaS-GNN's launch
rule, a launch budget with reaps, keep-alive expiry, prewarmed instances, one
pool of pairs or memory and compute pools, the gate balanced and latency, the
tree's timeouts under cost), both must give every request the same completion,
cold flag, dispatch and sharing, every execution the same start and end,
every instance the same life, and the buffers the same figures.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState
from gnn_faas.scheduler import function_pool
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.gateway_sim import run_gateway
from gnn_faas.traces.request_stream import KHopSets, RequestStream

NODES = 400


def _stream(seed: int, n: int = 6000) -> RequestStream:
    """Bursts (300/s) and lulls (5/s), and a silence longer than keep-alive
    halfway, over 60 vertices whose random k-hop sets overlap (so buffers share)."""
    rng = np.random.default_rng(seed)
    sets = [np.unique(rng.integers(0, NODES, int(rng.integers(5, 120)))) for _ in range(60)]
    indptr = np.concatenate([[0], np.cumsum([s.size for s in sets])]).astype(np.int64)
    khop = KHopSets(np.arange(60), indptr, np.concatenate(sets).astype(np.int64))
    rate = np.where((np.arange(n) // 700) % 2 == 0, 300.0, 5.0)
    arrivals = np.cumsum(rng.exponential(1.0 / rate))
    arrivals[n // 2 :] += 10.0
    rows = rng.integers(0, 60, n)
    return RequestStream(arrivals, rows, rows, khop)


def _calibration(split: bool, **kw) -> Calibration:
    cal = Calibration.bundled("bitcoin-otc")
    # service times near the bursts' gaps, so queues form and drain
    cal = dataclasses.replace(cal, exec_intercept_s=0.004, exec_per_row_s=4e-5,
                              keep_alive_s=3.0, **kw)  # fmt: skip
    return cal if split else dataclasses.replace(cal, memory_share=None)


CASES = {
    # name: (split pools, objective or None (no buffers), launch budget, calibration)
    "faas_gnn_rule_pairs": (False, None, None, {"max_instances": 3, "min_instances": 0}),
    "faas_gnn_rule_split": (True, None, None, {"max_instances": 4, "min_instances": 1}),
    "budget_no_buffers": (True, None, 0.5, {"max_instances": 4}),
    "balanced_budget": (True, "balanced", 0.1, {"max_instances": 4, "min_instances": 0}),
    "balanced_pairs_prewarmed": (False, "balanced", 1.0, {"max_instances": 3, "min_instances": 2}),
    "latency_budget": (True, "latency", 0.3, {"max_instances": 2}),
    "cost_tree": (True, "cost", 0.1, {"max_instances": 3}),
}


def _decide(b, state, now) -> int:
    """A stand-in for the timeout tree: every code, from the state's figures."""
    return int(state[2] + 3 * state[1] * 10) % 4 - 1


def _run(case: str, seed: int, fused: bool):
    split, objective, ratio, kw = CASES[case]
    cal = _calibration(split, **kw)
    stream = _stream(seed)
    state = None
    if objective is not None:
        state = BufferPoolState(BufferConfig(slo_s=0.3, objective=objective), NODES)
        if objective != "cost":
            state.set_capacity(cal.max_instances, 0.0)
    run = run_gateway(stream, cal, state, _decide if state is not None else None, seed=seed,
                      end_s=float(stream.arrivals[-1]) + 1.0, launch_wait_ratio=ratio,
                      tandem=objective == "cost", fused=fused)  # fmt: skip
    return run, (state.stats() if state is not None else None)


def _pools(run) -> list:
    pools = [run.pools] if hasattr(run.pools, "spawn") else [run.pools.memory, run.pools.compute]
    return [(p.start, p.end, p.spawn, p.stop) for p in pools]


@pytest.fixture(autouse=True)
def little_evidence(monkeypatch):
    """Reaps and budgeted launches within a short stream."""
    monkeypatch.setattr(function_pool, "MIN_EVIDENCE", 20)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_fused_pools_decide_as_the_policy_objects(case, seed):
    fast, fast_stats = _run(case, seed, fused=True)
    ref, ref_stats = _run(case, seed, fused=False)
    for name in ("done", "cold", "dispatched", "sharing"):
        assert np.array_equal(getattr(fast, name), getattr(ref, name)), name
    for got, want in zip(_pools(fast), _pools(ref), strict=True):
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w)
    assert (fast.reasons, fast.gate, fast.executions, fast.rows_total, fast.max_members) == (
        ref.reasons, ref.gate, ref.executions, ref.rows_total, ref.max_members)  # fmt: skip
    assert fast_stats == ref_stats


def test_the_cases_exercise_every_rule():
    """Launches while others queue, cold waits, stops before the end (keep-alive
    and reaps), buffers that shared, requests dispatched alone and held."""
    seen = {"launched_under_load": 0, "stopped_early": 0, "cold": 0}
    for case in CASES:
        run, stats = _run(case, 1, fused=True)
        end = float(_stream(1).arrivals[-1]) + 1.0
        for _, _, spawn, stop in _pools(run):
            seen["launched_under_load"] += int(np.count_nonzero(spawn > 0))
            seen["stopped_early"] += int(np.count_nonzero(stop < end - 0.5))
        seen["cold"] += int(np.count_nonzero(run.cold))
        if stats is not None and case.startswith("balanced"):
            assert stats["close_reasons"].get("idle", 0) > 0  # dispatched alone
            assert (
                stats["close_reasons"].get("capacity", 0) + stats["close_reasons"].get("held", 0)
                > 0
            )  # held for capacity, then released
            assert stats["overall_sharing_degree"] > 0
    assert all(v > 0 for v in seen.values()), seen
    # the budget reaps: an instance stops within the run though keep-alive alone
    # would keep it longer (here: the budget with no buffers, 3 s keep-alive)
    run, _ = _run("budget_no_buffers", 1, fused=True)
    assert any(np.any(stop - spawn < 3.0) for _, _, spawn, stop in _pools(run))

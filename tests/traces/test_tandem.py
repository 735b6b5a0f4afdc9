"""Memory and compute pools in series (:mod:`gnn_faas.traces.tandem`): each
execution's compute stage starts after its memory stage, each pool scales on
its own load, and the simulator bills each stage to its own function."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gnn_faas.config import BufferSettings
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.instance_pool import run_pool
from gnn_faas.traces.run import setup_simulation
from gnn_faas.traces.simulator import simulate
from gnn_faas.traces.tandem import run_tandem
from gnn_faas.traces.twitter import load_day


def _stage(cold_s: float):
    def run(ready, service):
        return run_pool(ready, service, mode="load_aware", cold_s=cold_s, keep_alive_s=60.0,
                        max_instances=8, min_instances=1, end_s=30.0)  # fmt: skip

    return run


def test_stages_in_series_and_pools_scale_apart():
    ready = np.arange(0.0, 20.0, 0.1)  # every 0.1 s an execution of 0.2 s
    service = np.full(ready.size, 0.2)
    t = run_tandem(ready, service, 0.9, _stage(0.5), _stage(1.5))
    # the compute stage starts when (or after) the memory stage ends, each takes its share
    assert np.all(t.compute.start >= t.memory.end - 1e-12)
    np.testing.assert_allclose(t.memory.end - t.memory.start, 0.18)
    np.testing.assert_allclose(t.compute.end - t.compute.start, 0.02)
    assert np.all(t.end - ready >= 0.2 - 1e-12)
    # 0.18 s memory stages every 0.1 s overlap: memory scales out; 0.02 s compute
    # stages never do: the one warm compute instance serves them all
    assert t.memory.spawn.size >= 2 and t.compute.spawn.size == 1
    assert t.cold_starts == t.memory.cold_starts + t.compute.cold_starts


@pytest.fixture(scope="module")
def setup(bitcoin_graph):
    """The ``cost`` objective: its buffers do not depend on the pools, so the
    tandem and the pairs run the same executions."""
    trace = load_day(seed=0).window(36_000.0, 60.0)
    cost = BufferSettings(objective="cost")
    return setup_simulation(
        trace, bitcoin_graph, Calibration.bundled("bitcoin-otc"), buffer_settings=cost
    )


@pytest.mark.parametrize("name", ["gnn_faas", "faas_gnn"])
def test_simulated_pools_against_pairs(setup, name):
    cal = setup.calibration
    tandem = dataclasses.replace(setup, calibration=dataclasses.replace(cal, memory_share=0.8))
    pairs = dataclasses.replace(setup, calibration=dataclasses.replace(cal, memory_share=None))
    t, p = simulate(tandem, [name])[name], simulate(pairs, [name])[name]
    # instances of both kinds at their own sizes; pairs are one kind of pair size
    assert set(np.unique(t.inst_mb)) == {cal.memory_function_mb, cal.compute_function_mb}
    assert set(np.unique(p.inst_mb)) == {cal.pair_mb}
    assert np.isin(t.inv_fn, [0, 1]).all() and p.inv_fn is None
    # a short compute stage needs fewer compute instances than memory ones
    kinds = t.inst_mb == cal.memory_function_mb
    assert (~kinds).sum() <= kinds.sum()
    tl = t.timeline()
    assert tl["allocated_gb"].sum() == pytest.approx(t.gb_s, rel=1e-9)
    assert tl["busy_gb"].sum() == pytest.approx(t.busy_gb_s, rel=1e-9)
    prices = load_prices()
    st, sp = t.summary(0.3, prices, 60.0), p.summary(0.3, prices, 60.0)
    assert st["executions"] == sp["executions"]
    # each stage billed to its function: less than billing both the whole execution
    assert 0 < st["dollars"]["lambda_x86"] < sp["dollars"]["lambda_x86"]
    assert st["completed"] == sp["completed"] == len(setup.stream)

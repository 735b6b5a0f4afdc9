"""``bench e2e``'s helpers: the rates it takes, the in-process PyG floor and the
median breakdown it reports (the stacks themselves run in the gateway tests)."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.bench.e2e import (
    inprocess_pyg_p50_ms,
    median_breakdown,
    parse_rates,
    summarise,
    warm_floor_gb_s,
)
from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.traces.replay import ReplayResult
from tests.pyg_reference import GCN, checkpoint_with_reference


def test_rates():
    assert parse_rates("1,10,40") == [1.0, 10.0, 40.0]
    assert parse_rates(20.0) == [20.0]
    for bad in ("", "a", "0", "-1,2", "inf"):
        with pytest.raises(InvalidRequest):
            parse_rates(bad)


def test_median_breakdown_per_step_and_per_call_kind():
    params = [
        {"breakdown_ms": {"parse": p, "aggregate": {"calls": 2, "work_ms": w}}}
        for p, w in ((1.0, 4.0), (3.0, 6.0), (2.0, 5.0))
    ]
    params.append({"buffer_wait_ms": 1.0})  # an answer without one is skipped
    assert median_breakdown(params) == {"parse": 2.0, "aggregate": {"calls": 2.0, "work_ms": 5.0}}
    assert median_breakdown([]) == {}


def test_warm_floor_is_the_warm_instances_memory_over_the_window():
    platform = {"memory_function_mb": 256, "compute_function_mb": 512, "min_instances": 1}
    assert warm_floor_gb_s(platform, 10.0) == pytest.approx(0.75 * 10.0)
    assert warm_floor_gb_s({**platform, "min_instances": 2}, 10.0) == pytest.approx(15.0)
    assert warm_floor_gb_s(platform, -1.0) == 0.0


def test_summary_reports_the_warm_floor_per_answered_request():
    # four requests, one failed; the last answer ends 2.5 s into the replay
    result = ReplayResult(
        sent=4,
        ok=3,
        errors=1,
        latencies_s=[0.01, 0.02, 0.5],
        arrival=np.array([0.0, 0.5, 1.0, 2.0]),
        send=np.array([0.0, 0.5, 1.0, 2.0]),
        latency=np.array([0.01, 0.02, np.nan, 0.5]),
        status=np.array([200, 200, 0, 200]),
    )
    metering = {"allocated_gb_s": 3.0, "vcpu_s": 6.0}
    platform = {"memory_function_mb": 512, "compute_function_mb": 512, "min_instances": 1}
    out = summarise(result, 0.3, metering, platform)
    assert out["gb_s_per_request"] == pytest.approx(1.0)
    assert out["warm_floor_gb_s_per_request"] == pytest.approx(1.0 * 2.5 / 3)
    assert "warm_floor_gb_s_per_request" not in summarise(result, 0.3, metering)


def test_inprocess_floor_runs_the_checkpoint(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)
    graph = open_graph(store, "bitcoin-otc")
    checkpoint_with_reference(graph, tmp_path / "ckpt", seed=1, **GCN)
    targets = np.arange(20)
    p50 = inprocess_pyg_p50_ms(graph, tmp_path / "ckpt", targets, n=20)
    assert np.isfinite(p50) and p50 > 0

"""Execution samples of ``gnn-faas simulate calibrate`` and ``replay --fit-warmup``."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.traces.measure_calibration import replay_executions
from gnn_faas.traces.replay import ReplayResult
from gnn_faas.traces.request_stream import KHopSets

# vertex 0's k-hop set is {0, 1}, vertex 1's {1, 2, 3}
SETS = KHopSets(np.array([0, 1]), np.array([0, 2, 5]), np.array([0, 1, 1, 2, 3]))


def result(latency, wait, aggregate, update, execution):
    n = len(latency)
    return ReplayResult(
        sent=n, ok=n, errors=0, latencies_s=list(latency), parameters=[],
        arrival=np.arange(n, dtype=float), send=np.arange(n, dtype=float),
        latency=np.asarray(latency, float), status=np.full(n, 200),
        buffer_wait=np.asarray(wait, float), sharing=np.zeros(n), execution=list(execution),
        aggregate=np.asarray(aggregate, float), update=np.asarray(update, float),
    )  # fmt: skip


def test_a_wait_far_beyond_the_usual_ones_is_capped_and_the_usual_ones_kept():
    # five lone executions of 30 ms instance time; waits around the calls of
    # 8, 10, 12 and 14 ms, and one of 500 ms (a cold start of the start-up)
    waits = np.array([0.008, 0.010, 0.012, 0.014, 0.500])
    r = result(
        latency=0.010 + 0.030 + waits, wait=[0.010] * 5,
        aggregate=[0.020] * 5, update=[0.010] * 5, execution="abcde",
    )  # fmt: skip
    got = replay_executions(r, np.array([0, 1, 0, 1, 0]), SETS, np.ones(5, bool))
    assert [rows for rows, _ in got] == [2, 3, 2, 3, 2]
    # Hampel's bound: median 12 ms + 3 x 1.4826 x MAD 2 ms
    bound = 0.012 + 3 * 1.4826 * 0.002
    np.testing.assert_allclose([s for _, s in got], 0.030 + np.minimum(waits, bound))
    assert got[3][1] == pytest.approx(0.044) and got[4][1] < 0.060


def test_one_execution_of_several_requests_is_one_sample_over_their_union():
    r = result(
        latency=[0.070, 0.080], wait=[0.020, 0.030], aggregate=[0.030] * 2,
        update=[0.010] * 2, execution="xx",
    )  # fmt: skip
    ((rows, secs),) = replay_executions(r, np.array([0, 1]), SETS, np.ones(2, bool))
    assert rows == 4 and secs == pytest.approx(0.050)


def test_without_instance_times_the_latency_after_the_buffer_counts():
    nan = [np.nan] * 3
    r = result(latency=[0.05, 0.06, 0.55], wait=[0.01] * 3, aggregate=nan, update=nan,
               execution="abc")  # fmt: skip
    got = replay_executions(r, np.array([0, 0, 1]), SETS, np.array([True, True, False]))
    np.testing.assert_allclose([s for _, s in got], [0.04, 0.05])


def test_calibration_stack_admits_everything():
    """Admission would shed the slow, loaded executions the calibration must
    measure: its stack runs with admission off, the deployment's sizes intact."""
    from gnn_faas.config import ModelServingConfig, ServingConfig, from_dict
    from gnn_faas.traces.measure_calibration import deployment

    base = ServingConfig(store="file:///tmp/s", models=(ModelServingConfig(name="g", graph="g"),))
    cfg = from_dict(ServingConfig, deployment(base, "g", 0.3, 256, 512, 4, 1, 600.0))
    assert cfg.gateway.admission is False
    assert cfg.platform.memory_function_mb == 256 and cfg.platform.max_compute_instances == 4
    assert cfg.models[0].mode == "graph_sharing"

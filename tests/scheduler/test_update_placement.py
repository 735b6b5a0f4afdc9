"""CPU or GPU Update by a threshold calibrated from measured latencies."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.scheduler.orchestrator import Orchestrator
from gnn_faas.scheduler.update_placement import LatencyLine, UpdatePlacement
from tests.functions.test_composition import cora_fetcher, make_model
from tests.scheduler.test_orchestrator import (
    InProcessClients,
    InProcessCompute,
    InProcessMemory,
    InProcessPool,
)


def test_threshold_where_the_lines_cross():
    # cpu: 1 ms + 10 us/row; gpu: 5 ms + 2 us/row -> cross at 4 ms / 8 us = 500 rows
    rows = np.array([100, 1000, 4000])
    cpu = [(r, 1e-3 + 10e-6 * r) for r in rows]
    gpu = [(r, 5e-3 + 2e-6 * r) for r in rows]
    p = UpdatePlacement.calibrate(cpu, gpu)
    assert p.threshold_rows == pytest.approx(500)
    assert p.choose(499) == "cpu" and p.choose(500) == "cuda"
    assert UpdatePlacement.from_json(p.to_json()).threshold_rows == pytest.approx(500)
    never = UpdatePlacement(LatencyLine(1e-3, 1e-6), LatencyLine(2e-3, 2e-6))
    assert math.isinf(never.threshold_rows) and never.choose(1e9) == "cpu"
    with pytest.raises(InvalidRequest, match="two or more sizes"):
        LatencyLine.fit([(10, 1.0)])


def test_orchestrator_routes_update_by_predicted_size(tmp_path):
    fetcher = cora_fetcher(tmp_path / "store")
    _, update = make_model("gcn", 2, fetcher, tmp_path)
    plan = ModelPlan.from_config(update.config)
    cpu_calls, gpu_calls = [], []
    ev = threading.Event()
    memory = InProcessMemory.__new__(InProcessMemory)
    from gnn_faas.functions.executor import LocalTransport

    memory.__init__(LocalTransport(fetcher, update), [], ev)
    ev.set()
    cpu_pool, gpu_pool = InProcessPool("cpu"), InProcessPool("gpu")
    compute = {
        "cpu": InProcessCompute(update, cpu_calls, ev),
        "gpu": InProcessCompute(update, gpu_calls, ev),
    }

    class Clients(InProcessClients):
        def compute(self, url):
            return compute["gpu" if "gpu" in url else "cpu"]

    placement = UpdatePlacement(LatencyLine(1e-3, 1e-5), LatencyLine(5e-3, 2e-6))  # 500 rows
    orch = Orchestrator(
        plan, InProcessPool("m"), cpu_pool, budget_bytes=1 << 30,
        clients=Clients(memory, None), gpu_compute_pool=gpu_pool, placement=placement,
    )  # fmt: skip
    cg = fetcher.fetch([1, 2, 3], 2, degrees=True)
    small, st = orch.run(cg, predicted_rows=10)
    assert st.device == "cpu" and cpu_calls and not gpu_calls
    big, st = orch.run(cg, predicted_rows=10_000)
    assert st.device == "cuda" and gpu_calls
    np.testing.assert_allclose(small, big, rtol=1e-6)

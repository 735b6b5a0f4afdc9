"""Latency profiles and function sizing (λGrapher 3.5): Bayesian-optimised core
counts meet the SLO and cost within 10% of the exhaustive optimum."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.scheduler.sizing.function_memory import (
    MIB,
    compute_function_bytes,
    memory_function_bytes,
    round_memory_mb,
    update_activation_row_bytes,
)
from gnn_faas.scheduler.sizing.function_sizing import (
    Prices,
    Stage,
    core_grid,
    exhaustive,
    size_functions,
    stages_from_profile,
)
from gnn_faas.scheduler.sizing.latency_profile import LatencyProfile, amdahl_profile, record_profile

# A 2-layer plan on a merged Bitcoin OTC buffer: (overhead s, s per row on 1 core,
# serial fraction). Aggregate is memory-bound (poor scaling), Update is dense
# matrix work (scales well).
STAGE_MODEL = {
    "aggregate/1": (0.004, 12e-6, 0.5),
    "update/1": (0.006, 30e-6, 0.08),
    "aggregate/2": (0.004, 10e-6, 0.5),
    "update/2": (0.006, 20e-6, 0.1),
}
ROWS = {"aggregate/1": 3000, "update/1": 3000, "aggregate/2": 400, "update/2": 400}
CORES = [0.25, 0.5, 1.0, 2.0, 4.0]


def memory_mb() -> dict[str, int]:
    """Stage memory from the formulas: Aggregate of 3000/400 rows of width 128,
    Update 128 -> 64 -> 2 (weights + activations)."""
    agg1 = memory_function_bytes(4000, 20000, 3000, 512, 512, 96 * MIB)
    agg2 = memory_function_bytes(3000, 3000, 400, 256, 256, 96 * MIB)
    upd1 = compute_function_bytes(
        128 * 64 * 4, 3000, update_activation_row_bytes(128, 64), 384 * MIB
    )
    upd2 = compute_function_bytes(64 * 2 * 4, 400, update_activation_row_bytes(64, 2), 384 * MIB)
    sizes = {"aggregate/1": agg1, "aggregate/2": agg2, "update/1": upd1, "update/2": upd2}
    return {k: round_memory_mb(v) for k, v in sizes.items()}


@pytest.fixture(scope="module")
def profile() -> LatencyProfile:
    return amdahl_profile(STAGE_MODEL, CORES, [100, 1000, 5000])


def amdahl(stage: str, cores: float, rows: int) -> float:
    overhead, per_row, serial = STAGE_MODEL[stage]
    return overhead + rows * per_row * (serial + (1 - serial) / cores)


# -- memory formulas -----------------------------------------------------------
def test_memory_formulas_and_rounding():
    m = memory_function_bytes(10, 20, 5, 100, 50, 1000)
    assert m == 1000 + 10 * 100 + 20 * 12 + 5 * 50
    np.testing.assert_array_equal(
        memory_function_bytes(np.array([1, 2]), np.array([0, 1]), 1, 4, 4, 0), [8, 24]
    )
    assert compute_function_bytes(400, 10, 24, 1000) == 1000 + 400 + 10 * 24
    assert round_memory_mb(1) == 128
    assert round_memory_mb(129 * MIB) == 192
    assert round_memory_mb(192 * MIB) == 192
    with pytest.raises(ValueError):
        round_memory_mb(20_000 * MIB, max_mb=10240)
    assert all(v % 64 == 0 and v >= 128 for v in memory_mb().values())


# -- latency profile -----------------------------------------------------------
def test_profile_interpolates_amdahl_exactly(profile):
    # Amdahl latency is linear in rows and in 1/cores: interpolation is exact.
    for stage in STAGE_MODEL:
        for cores, rows in [(0.75, 3000), (1.5, 400), (3.0, 2500), (0.25, 100), (1.0, 777)]:
            assert profile.latency(stage, cores, rows) == pytest.approx(amdahl(stage, cores, rows))
        # Beyond the largest size: extrapolated along the last segment.
        assert profile.latency(stage, 1.0, 8000) == pytest.approx(amdahl(stage, 1.0, 8000))
        # Beyond the most cores: no further speedup assumed (errs on the slow side).
        assert profile.latency(stage, 8.0, 3000) == pytest.approx(amdahl(stage, 4.0, 3000))


def test_profile_json_round_trip(profile, tmp_path):
    path = tmp_path / "profile.json"
    profile.save(path)
    loaded = LatencyProfile.load(path)
    assert loaded.stages() == sorted(STAGE_MODEL)
    assert loaded.cores("update/1") == CORES
    for stage in STAGE_MODEL:
        assert loaded.latency(stage, 0.75, 1234) == profile.latency(stage, 0.75, 1234)
    with pytest.raises(NotFound):
        LatencyProfile.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InvalidRequest):
        LatencyProfile.load(tmp_path / "bad.json")
    with pytest.raises(NotFound):
        profile.latency("no-such-stage", 1, 1)


def test_record_profile_measures_real_calls():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((2000, 64)).astype(np.float32)
    weight = rng.standard_normal((64, 32)).astype(np.float32)
    calls: list[tuple[str, float, int]] = []

    def aggregate(cores: float, rows: int) -> None:  # real numpy work, wall-timed
        calls.append(("aggregate", cores, rows))
        idx = rng.integers(0, features.shape[0], (rows, 8))
        features[idx].sum(axis=1)

    def update(cores: float, rows: int) -> float:  # reports its own timing
        calls.append(("update", cores, rows))
        features[:rows] @ weight
        return 0.001 * rows / cores

    prof = record_profile(
        {"aggregate": aggregate, "update": update}, [1.0, 2.0], [100, 1000], repeats=2
    )
    assert len(calls) == 2 * 2 * 2 * (1 + 2)  # stages x cores x rows x (warmup + repeats)
    assert prof.stages() == ["aggregate", "update"]
    for c in (1.0, 2.0):
        for r in (100, 1000):
            assert len(prof.samples["aggregate"][c][r]) == 2
            assert all(s > 0 for s in prof.samples["aggregate"][c][r])
            assert prof.latency("update", c, r) == pytest.approx(0.001 * r / c)


# -- sizing ----------------------------------------------------------------------
def brute_force(stages, budget, prices, grid):
    best = None
    for combo in itertools.product(grid, repeat=len(stages)):
        lat = sum(s.latency(c) for s, c in zip(stages, combo, strict=True))
        cost = sum(
            float(prices.rate(c, s.memory_mb)) * s.latency(c)
            for s, c in zip(stages, combo, strict=True)
        )
        if lat <= budget and (best is None or cost < best[0]):
            best = (cost, combo)
    return best


def test_exhaustive_is_the_exact_optimum(profile):
    stages = stages_from_profile(
        profile, {k: ROWS[k] for k in ("aggregate/1", "update/1", "update/2")}, memory_mb()
    )
    grid = core_grid(2.0, 0.25)
    for slo, timeout in [(0.2, 0.05), (0.12, 0.02)]:
        ex = exhaustive(stages, slo, timeout, max_cores=2.0)
        cost, combo = brute_force(stages, slo - timeout, Prices(), grid)
        assert ex.feasible and ex.cost == pytest.approx(cost)
        assert tuple(ex.cores.values()) == combo
        assert ex.total_latency_s <= slo - timeout


def test_bayes_opt_meets_slo_within_10_percent_of_optimum(profile):
    stages = stages_from_profile(profile, ROWS, memory_mb())
    slo, timeout = 0.3, 0.1  # the Bitcoin OTC SLO; 0.1 s waiting in a buffer
    ex = exhaustive(stages, slo, timeout)
    bo = size_functions(stages, slo, timeout, seed=0)
    assert ex.feasible and bo.feasible
    assert bo.total_latency_s <= slo - timeout
    assert sum(amdahl(s, bo.cores[s], ROWS[s]) for s in ROWS) == pytest.approx(bo.total_latency_s)
    assert bo.cost <= 1.10 * ex.cost
    assert set(bo.cores.values()) <= set(core_grid().tolist())
    # The constraint binds: the cheapest configuration overall would miss it.
    cheapest = sum(amdahl(s, 0.25, ROWS[s]) for s in ROWS)
    assert cheapest > slo - timeout
    assert bo.evaluations < ex.evaluations


def test_bayes_opt_is_deterministic(profile):
    stages = stages_from_profile(profile, ROWS, memory_mb())
    a = size_functions(stages, 0.3, 0.1, seed=3, init_points=4, n_iter=6)
    b = size_functions(stages, 0.3, 0.1, seed=3, init_points=4, n_iter=6)
    assert a == b


def test_infeasible_slo_returns_fastest(profile):
    stages = stages_from_profile(profile, ROWS, memory_mb())
    bo = size_functions(stages, 0.05, 0.0)
    ex = exhaustive(stages, 0.05, 0.0)
    assert not bo.feasible and not ex.feasible
    assert set(bo.cores.values()) == set(ex.cores.values()) == {4.0}


def test_bad_sizing_input():
    stage = Stage("s", 128, lambda c: 0.1 / c)
    with pytest.raises(InvalidRequest):
        exhaustive([stage], 0.1, 0.2)
    with pytest.raises(InvalidRequest):
        size_functions([], 0.3)
    with pytest.raises(InvalidRequest):
        core_grid(0.1, 0.25)

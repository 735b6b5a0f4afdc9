"""A policy's figures reduced as its results come, in chunks and through
spill files, are the figures of the whole run (bit for bit), and a repeated
trace (``--days``) runs as the trace written out would."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gnn_faas.config import BufferSettings
from gnn_faas.traces import gateway_sim, reduce, request_stream, twitter
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.request_stream import build_stream
from gnn_faas.traces.run import setup_simulation
from gnn_faas.traces.simulator import POLICIES, serverful_plan, simulate, summarise
from gnn_faas.traces.timeline import counts_per_second, coverage, in_flight


@pytest.fixture(scope="module")
def calibration():
    return Calibration.bundled("bitcoin-otc")


@pytest.fixture(scope="module")
def window():
    return twitter.load_day(seed=0).window(30_000.0, 150.0, warmup_s=20.0)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few hundred requests, spills on disk after a few hundred values."""
    monkeypatch.setattr(request_stream, "CHUNK_REQUESTS", 300)
    monkeypatch.setattr(gateway_sim, "CHUNK", 256)
    monkeypatch.setattr(reduce, "MEMORY_LIMIT", 500)
    monkeypatch.setattr(reduce, "LEAF", 256)


def whole_summary(run, warmup_s, duration_s):
    return run.after(warmup_s).summary(0.3, load_prices(), duration_s)


@pytest.mark.parametrize("objective", ["balanced", "cost"])
def test_streamed_figures_equal_the_whole_runs(window, bitcoin_graph, calibration, objective,
                                               small_chunks):  # fmt: skip
    setup = setup_simulation(window, bitcoin_graph, calibration,
                             buffer_settings=BufferSettings(objective=objective))  # fmt: skip
    runs = simulate(setup, POLICIES)
    for name in POLICIES:
        want = whole_summary(runs[name], window.warmup_s, window.measured_s)
        got, acc = summarise(name, setup, slo_s=0.3, prices=load_prices(),
                             warmup_s=window.warmup_s, measured_s=window.measured_s)  # fmt: skip
        assert not acc.lat.in_memory  # the run did go through the files
        acc.close()
        for key in want.keys() - {"wall_s"}:
            assert got[key] == want[key], (name, key)


def test_streamed_timeline_equals_the_whole_runs(window, bitcoin_graph, calibration, small_chunks):
    setup = setup_simulation(window, bitcoin_graph, calibration)
    for name in ("gnn_faas", "serverful"):
        run = simulate(setup, [name])[name].after(window.warmup_s)
        _, acc = summarise(name, setup, slo_s=0.3, prices=load_prices(),
                           warmup_s=window.warmup_s, measured_s=window.measured_s,
                           timeline=True)  # fmt: skip
        got = acc.timeline_columns()
        acc.close()
        n = run.horizon()
        ok = ~run.dropped
        assert list(got) == ["second", "arrivals", "completions", "in_flight", "instances",
                             "allocated_gb", "busy_gb"]  # fmt: skip
        np.testing.assert_array_equal(got["arrivals"], counts_per_second(run.arrivals, n))
        np.testing.assert_array_equal(got["completions"], counts_per_second(run.done[ok], n))
        np.testing.assert_array_equal(
            got["in_flight"], in_flight(run.arrivals, np.where(ok, run.done, np.inf), n)
        )
        # coverage's cumulative sums lose digits that the per-interval sums keep
        busy = coverage(run.inv_start, run.inv_end, run.inv_mb / 1024.0, n)
        np.testing.assert_allclose(got["busy_gb"], busy, rtol=1e-7, atol=1e-9)
        assert got["busy_gb"].sum() == pytest.approx(run.busy_gb_s, rel=1e-12)


def test_days_run_the_trace_written_out(bitcoin_graph, calibration, small_chunks):
    """Three repeats of a window (the state carried over, the request order
    going on) give the figures of the three windows' arrivals written out."""
    trace = twitter.load_day(seed=0).window(30_000.0, 120.0)
    setup = setup_simulation(trace, bitcoin_graph, calibration, repeats=3)
    arr = np.concatenate([trace.arrivals + 120.0 * p for p in range(3)])
    whole = dataclasses.replace(setup, stream=build_stream(bitcoin_graph, arr, calibration.hops))
    assert setup.duration_s == 360.0 and len(setup.stream) == arr.size
    runs = simulate(whole, POLICIES)
    for name in POLICIES:
        want = whole_summary(runs[name], 0.0, 360.0)
        got, acc = summarise(name, setup, slo_s=0.3, prices=load_prices(), warmup_s=0.0,
                             measured_s=360.0)  # fmt: skip
        acc.close()
        for key in want.keys() - {"wall_s"}:
            assert got[key] == want[key], (name, key)


def test_ratio_draws_are_the_same_in_blocks():
    """The premise of the simulator's draws: numpy's bounded integers drawn in
    blocks are the sequence drawn at once."""
    for k in (1, 7, 198, 1000):
        whole = np.random.default_rng(0).integers(0, k, 100_003)
        rng = np.random.default_rng(0)
        blocks = np.concatenate([rng.integers(0, k, b) for b in (65_536, 1, 34_466)])
        np.testing.assert_array_equal(blocks, whole)


def test_serverful_plan_per_minute():
    """``n_k = max(1, ⌈W_{k−1} / 48 s⌉)``, ``n_0`` from ``W_0``; the last
    minute's plan holds past the trace."""
    arrivals = np.array([1.0, 30.0, 61.0, 62.0, 150.0])
    service = np.array([30.0, 30.0, 100.0, 1.0, 5.0])
    w = np.bincount((arrivals // 60).astype(int), weights=service, minlength=3)
    want = np.maximum(1, np.ceil(w / 48.0))
    np.testing.assert_array_equal(serverful_plan(arrivals, service, 180.0),
                                  [want[0], want[0], want[1]])  # fmt: skip

"""Spreading per-bin counts: counts kept exactly, arrivals inside their bin,
seeded, for every method; time windows and compression."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.traces.trace import SPREADS, Trace, TraceFormatError, compress, open_lines, spread


@pytest.mark.parametrize("method", SPREADS)
def test_spread_keeps_counts_inside_bins(method):
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 40, 200)
    counts[[0, 5, 199]] = 0
    t = spread(counts, 60.0, method, np.random.default_rng(1))
    assert t.size == counts.sum()
    assert np.all(np.diff(t) >= 0)
    np.testing.assert_array_equal(np.bincount((t // 60).astype(int), minlength=200), counts)
    again = spread(counts, 60.0, method, np.random.default_rng(1))
    np.testing.assert_array_equal(t, again)
    if method != "equidistant":
        assert not np.array_equal(t, spread(counts, 60.0, method, np.random.default_rng(2)))


def test_equidistant_and_exponential_shapes():
    t = spread(np.array([4]), 60.0, "equidistant")
    np.testing.assert_allclose(t, [7.5, 22.5, 37.5, 52.5])
    # exponential gaps: the mean of many arrivals sits near the middle of the bin
    e = spread(np.array([20000]), 1.0, "exponential", np.random.default_rng(0))
    assert abs(e.mean() - 0.5) < 0.01
    gaps = np.diff(e)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV 1


def test_spread_rejects_bad_input():
    with pytest.raises(InvalidRequest):
        spread(np.array([1]), 1.0, "poisson")
    with pytest.raises(InvalidRequest):
        spread(np.array([-1]), 1.0)


def test_window_and_compress():
    tr = Trace("x", np.array([0.5, 10.0, 61.0, 119.0]), np.zeros(4, np.int32), ("f",), 120.0)
    w = tr.window(60.0, 60.0)
    np.testing.assert_allclose(w.arrivals, [1.0, 59.0])
    assert w.duration_s == 60.0
    np.testing.assert_allclose(compress(tr.arrivals, 2.0), tr.arrivals / 2)
    np.testing.assert_array_equal(tr.per_second()[[0, 10, 61, 119]], [1, 1, 1, 1])
    with pytest.raises(InvalidRequest):
        compress(tr.arrivals, 0.0)


def test_open_lines_names_truncated_gzip(tmp_path):
    p = tmp_path / "t.gz"
    data = gzip.compress(("x\n" * 5000).encode())
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"t\.gz, line \d+: truncated"):
        list(open_lines(p))
    with pytest.raises(NotFound):
        list(open_lines(tmp_path / "missing.gz"))


def test_window_with_a_warm_up():
    tr = Trace("x", np.array([0.5, 10.0, 55.0, 61.0, 119.0]), np.zeros(5, np.int32), ("f",), 120.0)
    w = tr.window(50.0, 70.0, warmup_s=10.0)
    np.testing.assert_allclose(w.arrivals, [5.0, 11.0, 69.0])
    assert (w.warmup_s, w.measured_s, w.measured_requests) == (10.0, 60.0, 2)
    assert (tr.warmup_s, tr.measured_requests) == (0.0, 5)

"""Twitter trace: the per-second day and the raw hour; bad files named."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from gnn_faas.traces import twitter
from gnn_faas.traces.trace import TraceFormatError


def test_day_keeps_counts_per_second():
    counts = twitter.load_per_second()
    day = twitter.load_day(seed=1)
    assert day.requests == counts.sum() == 4_395_692
    np.testing.assert_array_equal(np.bincount(day.arrivals.astype(int), minlength=86400), counts)


def test_raw_hour_is_the_cumulative_sum(tmp_path):
    hour = twitter.load_raw_hour()
    assert hour.requests == 126_294
    assert 3500 < hour.arrivals[-1] < 3700 and np.all(np.diff(hour.arrivals) >= 0)
    p = tmp_path / "tw.gz"
    with gzip.open(p, "wt") as f:
        f.write("0.5\n0.25\n1.0\n")
    np.testing.assert_allclose(twitter.load_raw_hour(p).arrivals, [0.0, 0.25, 1.25])


def test_bad_files_are_named(tmp_path):
    p = tmp_path / "tw.gz"
    with gzip.open(p, "wt") as f:
        f.write("0.5\n0.25\nabc\n")
    with pytest.raises(TraceFormatError, match=r"tw\.gz, line 3: not an inter-arrival"):
        twitter.load_raw_hour(p)
    npz = tmp_path / "x.npz"
    npz.write_bytes(b"not a zip")
    with pytest.raises(TraceFormatError, match=r"x\.npz"):
        twitter.load_per_second(npz)


def test_a_raw_hour_given_as_the_day_points_to_raw_hour(tmp_path):
    p = tmp_path / "TW_may25_0-1.gz"
    with gzip.open(p, "wt") as f:
        f.write("0.5\n0.25\n")  # a valid raw hour
    with pytest.raises(TraceFormatError) as err:
        twitter.load_per_second(p)
    assert "--raw-hour" in str(err.value) and "pickle" not in str(err.value)


@pytest.mark.parametrize(
    "start_s, duration_s, warmup_s, spread, speedup",
    [
        (0.0, 7200.0, 0.0, "uniform", 1.0),  # the two-hour window from midnight
        (27_000.0, 360.0, 60.0, "uniform", 1.0),  # mid-day, after a warm-up
        (1234.5, 77.25, 0.0, "uniform", 1.0),  # edges inside seconds
        (600.0, 90.0, 0.0, "uniform", 3.0),  # compressed time
        (84_500.0, 2000.0, 0.0, "uniform", 1.0),  # running past the end of the day
        (5000.0, 30.0, 0.0, "equidistant", 1.0),
        (5000.0, 30.0, 0.0, "exponential", 1.0),
    ],
)
def test_a_window_is_the_days_window(start_s, duration_s, warmup_s, spread, speedup):
    """Spreading only the window's seconds gives the day's window bit for bit."""
    day = twitter.load_day(spread_method=spread, seed=3, speedup=speedup)
    want = day.window(start_s, duration_s, warmup_s)
    got = twitter.load_window(start_s, duration_s, warmup_s=warmup_s, spread_method=spread,
                              seed=3, speedup=speedup)  # fmt: skip
    assert got.requests > 0
    np.testing.assert_array_equal(got.arrivals, want.arrivals)
    np.testing.assert_array_equal(got.function, want.function)
    assert (got.name, got.functions, got.duration_s, got.meta) == (
        want.name, want.functions, want.duration_s, want.meta)  # fmt: skip

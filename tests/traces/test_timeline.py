"""Per-second coverage of intervals equals their integral."""

from __future__ import annotations

import numpy as np

from gnn_faas.traces.timeline import counts_per_second, coverage, in_flight


def test_coverage_hand_case():
    c = coverage(np.array([0.5, 1.0]), np.array([2.25, 1.5]), np.array([2.0, 1.0]), 3)
    np.testing.assert_allclose(c, [1.0, 2.0 + 0.5, 0.5])


def test_coverage_integral_random():
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 100, 1000)
    e = s + rng.exponential(5, 1000)
    w = rng.uniform(0.1, 2, 1000)
    c = coverage(s, e, w, int(np.ceil(e.max())))
    assert c.min() >= -1e-9
    np.testing.assert_allclose(c.sum(), np.sum((e - s) * w), rtol=1e-9)


def test_counts_and_in_flight():
    np.testing.assert_array_equal(counts_per_second(np.array([0.1, 0.9, 2.5]), 3), [2, 0, 1])
    np.testing.assert_array_equal(
        in_flight(np.array([0.0, 0.5, 1.5]), np.array([1.2, 0.7, np.inf]), 3), [1, 1, 1]
    )

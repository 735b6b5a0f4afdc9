"""The baselines' instance pools on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.traces.instance_pool import run_pool


def test_naive_launches_when_none_idle_and_keeps_alive():
    ready = np.array([0.0, 0.1, 5.0, 100.0])
    service = np.array([1.0, 1.0, 1.0, 1.0])
    r = run_pool(ready, service, mode="naive", cold_s=0.5, keep_alive_s=10.0)
    # request 0 and 1 overlap: two cold starts; request 2 reuses instance 0;
    # request 3 comes after every keep-alive: a third cold start
    np.testing.assert_allclose(r.start, [0.5, 0.6, 5.0, 100.5])
    np.testing.assert_array_equal(r.cold, [True, True, False, True])
    assert r.cold_starts == 3
    # instance 0 idles from 6.0, instance 1 from 1.6: both stop 10 s later
    np.testing.assert_allclose(r.stop[:2], [16.0, 11.6])


def test_load_aware_bypasses_the_cold_start():
    ready = np.array([0.0, 0.1, 0.2])
    service = np.array([0.3, 0.3, 0.3])
    r = run_pool(ready, service, mode="load_aware", cold_s=2.0, keep_alive_s=60.0,
                 max_instances=2, min_instances=1)  # fmt: skip
    # 0 runs warm; 1 launches a second instance but queues on the first (free at 0.3)
    # 2 waits for the first again (0.6) rather than the launch (ready at 2.1)
    np.testing.assert_allclose(r.start, [0.0, 0.3, 0.6])
    assert r.cold_starts == 1 and not r.cold.any()


def test_fleet_follows_the_plan():
    ready = np.arange(0, 120, 0.5)
    service = np.full(ready.size, 0.2)
    r = run_pool(ready, service, mode="fleet", cold_s=1.0, plan=np.array([1, 3]),
                 interval_s=60.0, end_s=120.0)  # fmt: skip
    assert r.spawn.size == 3
    np.testing.assert_allclose(sorted(r.spawn), [0.0, 60.0, 60.0])
    assert np.all(r.stop == 120.0)
    assert np.all(r.start >= ready) and np.all(r.end - r.start == pytest.approx(0.2))

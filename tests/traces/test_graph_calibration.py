"""calibrate-graph: the graph's figures measured on it, the platform's kept from the base."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.graph_calibration import GROUP_SIZES, calibrate_graph, measure_executions
from gnn_faas.traces.request_stream import khop_sets, request_order


def test_executions_count_the_union_of_their_khop_sets(bitcoin_graph):
    order = request_order(bitcoin_graph)
    samples = measure_executions(bitcoin_graph, 2, order, hidden=8, per_group=1)
    assert len(samples) == len(GROUP_SIZES)
    sets = khop_sets(bitcoin_graph, np.unique(order[: sum(GROUP_SIZES)]), 2)
    pos = {int(v): j for j, v in enumerate(sets.vertices)}
    k = 0
    for size, (rows, seconds) in zip(GROUP_SIZES, samples, strict=True):
        union = np.unique(np.concatenate([sets.set_of(pos[int(t)]) for t in order[k : k + size]]))
        k += size
        assert rows == union.size and seconds >= 0


def test_calibrate_graph_keeps_the_platform_and_measures_the_graph(bitcoin_store, bitcoin_graph):
    base = Calibration.bundled("bitcoin-otc")
    cal = calibrate_graph(base, bitcoin_graph, bitcoin_store, max_instances=32, per_group=1,
                          log=lambda m: None)  # fmt: skip
    for k in ("cold_start_memory_s", "cold_start_compute_s", "runtime_mb", "memory_share",
              "memory_function_mb", "compute_function_mb", "keep_alive_s", "hops"):  # fmt: skip
        assert getattr(cal, k) == getattr(base, k), k
    assert cal.max_instances == 32 and cal.graph == "bitcoin-otc"
    g = bitcoin_graph
    blobs = sum(g.info(b).nbytes for b in ("indptr", "indices", "features"))
    assert cal.graph_mb == pytest.approx(blobs / 2**20)
    m = g.manifest
    assert cal.row_bytes == pytest.approx(m.feature_dim * 4 * 3 + 12 * m.num_edges / m.num_nodes)
    assert cal.full_fetch_s > 0 and cal.exec_per_row_s >= 0
    assert cal.exec_intercept_s >= base.exec_intercept_s
    assert len(cal.samples) == len(GROUP_SIZES)
    assert cal.meta["graph_shape"]["edges"] == m.num_edges
    # it round-trips through its file
    assert Calibration.from_dict(cal.to_dict()) == cal


def test_sampled_executions_count_the_live_fetchers_rows(bitcoin_graph):
    """With fanouts, a group's rows are what the live fetcher reads for the
    merged group (the serving config's ``fanouts``), the union of the per-vertex
    sampled sets the simulator builds, and at most ``1 + f1 + f1·f2`` a target."""
    from gnn_faas.storage.fetcher import KHopFetcher

    order = request_order(bitcoin_graph)
    fan = (3, 2)
    sampled = measure_executions(bitcoin_graph, 2, order, hidden=8, per_group=1, fanouts=fan)
    full = measure_executions(bitcoin_graph, 2, order, hidden=8, per_group=1)
    live = KHopFetcher(bitcoin_graph)
    sets = khop_sets(bitcoin_graph, np.unique(order[: sum(GROUP_SIZES)]), 2, fan)
    pos = {int(v): j for j, v in enumerate(sets.vertices)}
    k = 0
    for size, (rows, _), (full_rows, _) in zip(GROUP_SIZES, sampled, full, strict=True):
        group = order[k : k + size]
        k += size
        assert rows == live.fetch(group, 2, fan).input_nodes.size
        union = np.unique(np.concatenate([sets.set_of(pos[int(t)]) for t in group]))
        assert rows == union.size
        assert rows <= size * (1 + 3 + 3 * 2) and rows <= full_rows
    assert sum(r for r, _ in sampled) < sum(r for r, _ in full)  # the sample bites here


def test_calibrate_graph_with_fanouts_stores_them(bitcoin_store, bitcoin_graph):
    base = Calibration.bundled("bitcoin-otc")
    cal = calibrate_graph(base, bitcoin_graph, bitcoin_store, per_group=1, fanouts=(4, 4),
                          log=lambda m: None)  # fmt: skip
    assert cal.fanouts == (4, 4) and "--fanouts 4,4" in cal.meta["command"]
    assert all(rows <= 4 * (1 + 4 + 16) for rows, _ in cal.samples)
    assert Calibration.from_dict(cal.to_dict()) == cal
    with pytest.raises(InvalidRequest, match="one fanout per hop"):
        calibrate_graph(base, bitcoin_graph, bitcoin_store, fanouts=(4,), log=lambda m: None)
    bad = {**cal.to_dict(), "fanouts": [4]}
    with pytest.raises(InvalidRequest, match="fanouts"):
        Calibration.from_dict(bad)

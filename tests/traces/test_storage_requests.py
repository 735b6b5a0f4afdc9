"""The per-fetch storage request model: measured with the real fetcher, applied
to live runs; the planner's constants decide the counts, not the backend."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gnn_faas.storage.fetcher import STRUCTURE_SLACK_BYTES, KHopFetcher
from gnn_faas.storage.request_cost import load_constants
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.live import live_storage, served_fanouts
from gnn_faas.traces.request_stream import request_order
from gnn_faas.traces.storage_requests import GROUPS, measure_fetch_requests


def test_fetch_requests_model_on_bitcoin_otc(bitcoin_graph):
    order = request_order(bitcoin_graph)
    model = measure_fetch_requests(bitcoin_graph, 2, order, per_group=2)
    assert model.scheme == "s3" and model.fetches == 2 * len(GROUPS)
    assert model.full_download == 1 + len(bitcoin_graph.manifest.blobs)
    # the fit predicts what the fetcher does under S3's constants: the mean GETs of
    # single-target fetches (what a request_centric execution makes) within a
    # factor of 2 (a line through a curve that falls once a fetch covers most of
    # the file and the byte budget lets its reads merge: see the docstring)
    gets, rows = [], []
    for t in order[20:28]:
        single = KHopFetcher(bitcoin_graph, load_constants()["s3"])
        c = single.fetch([int(t)], 2)
        single.read_features(c.input_nodes)
        gets.append(single.stats.ranges_requested)
        rows.append(c.input_nodes.size)
    predicted = model.per_fetch + model.per_row * float(np.mean(rows))
    assert 0.5 <= float(np.mean(gets)) / predicted <= 2.0
    fetcher = KHopFetcher(bitcoin_graph, load_constants()["s3"])
    cg = fetcher.fetch(order[:1], 2)
    fetcher.read_features(cg.input_nodes)
    # a request on S3 costs ~1 MB of transfer: each structure read fits its 1 MiB
    # slack whole (one GET each, 2 per hop); the feature rows are merged as far as
    # twice their bytes allow
    st = fetcher.stats
    assert st.round_trips == 5 and st.bytes_read <= 2 * st.bytes_needed + 4 * STRUCTURE_SLACK_BYTES
    assert st.ranges_requested < cg.input_nodes.size
    # planning with a file's constants makes many more, smaller requests
    cheap = KHopFetcher(bitcoin_graph, load_constants()["file"])
    cheap.fetch(order[:1], 2)
    cheap.read_features(cg.input_nodes)
    assert cheap.stats.ranges_requested > fetcher.stats.ranges_requested


def test_live_storage_counts_executions(bitcoin_graph):
    result = SimpleNamespace(
        status=np.array([200, 200, 200, 500, 200]),
        execution=["a", "a", "b", None, None],
    )
    run = SimpleNamespace(result=result, summary={"requests": 5, "cold_starts": 2})
    prices = load_prices()
    model = live_storage(run, bitcoin_graph, 2, "graph_sharing", prices, 60.0)
    st = run.summary["storage"]
    # executions: "a", "b" and the one unnamed answered request
    assert st["gets"] == pytest.approx(
        3 * model.per_fetch + 3 * model.per_row * model.rows_per_request
    )
    assert st["dollars"]["s3_standard"] == pytest.approx(st["gets"] * 0.0004 / 1000)
    # a model served with sampled fanouts fetches at most 1 + 2 + 4 rows a request
    sampled = live_storage(run, bitcoin_graph, 2, "graph_sharing", prices, 60.0, (2, 2))
    assert sampled.rows_per_request <= 1 + 2 + 4 < model.rows_per_request
    assert run.summary["storage"]["gets"] < st["gets"]
    assert served_fanouts({"fanouts": [2, 2]}) == (2, 2)
    assert served_fanouts({"fanouts": [-1, -1]}) is None and served_fanouts({}) is None

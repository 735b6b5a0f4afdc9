"""The per-fetch storage request model: measured with the real fetcher, applied
to live runs; the planner's constants decide the counts, not the backend."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.request_cost import load_constants
from gnn_faas.traces.cost import load_prices
from gnn_faas.traces.live import live_storage
from gnn_faas.traces.request_stream import request_order
from gnn_faas.traces.storage_requests import GROUPS, measure_fetch_requests


def test_fetch_requests_model_on_bitcoin_otc(bitcoin_graph):
    order = request_order(bitcoin_graph)
    model = measure_fetch_requests(bitcoin_graph, 2, order, per_group=2)
    assert model.scheme == "s3" and model.fetches == 2 * len(GROUPS)
    assert model.full_download == 1 + len(bitcoin_graph.manifest.blobs)
    # the fit predicts what the fetcher does under S3's constants
    fetcher = KHopFetcher(bitcoin_graph, load_constants()["s3"])
    cg = fetcher.fetch(order[:1], 2)
    fetcher.read_features(cg.input_nodes)
    predicted = model.per_fetch + model.per_row * cg.input_nodes.size
    assert fetcher.stats.ranges_requested == pytest.approx(predicted, rel=0.5)
    # a request on S3 costs ~1 MB of transfer: a 2-hop fetch of this 3 MB graph is
    # one GET per read (2 per hop, 1 of features)
    assert fetcher.stats.ranges_requested == 5
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

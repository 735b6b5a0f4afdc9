"""The peak-memory predictor: profiled real requests, held-out error, numpy export."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.peak_predictor import (
    PeakPredictor,
    RequestShape,
    analytic_peak,
    bundled_predictor_path,
    shape_features,
)
from gnn_faas.functions.profiler import (
    fit_predictor,
    profile_requests,
    relative_errors,
    split_by_request,
)
from gnn_faas.storage.datasets import ensure_dataset


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = f"file://{tmp_path_factory.mktemp('store')}"
    ensure_dataset(uri, "bitcoin-otc")
    ensure_dataset(uri, "cora")
    return uri


@pytest.mark.slow
@pytest.mark.parametrize(
    "graph, requests, max_hops, max_batch",
    [("bitcoin-otc", 250, 3, 64), ("cora", 150, 2, 16)],
)
def test_median_error_below_10_percent_on_heldout_requests(
    store, graph, requests, max_hops, max_batch
):
    g = ensure_dataset(store, graph)
    profiles = profile_requests(g, requests, seed=7, max_batch=max_batch, max_hops=max_hops)
    assert {p.op for p in profiles} >= {"gcn", "mean", "max", "gat"}
    assert len({p.num_src for p in profiles}) > 50  # real, varied request sizes
    train, test = split_by_request(profiles, 0.3, seed=7)
    assert not {p.request for p in train} & {p.request for p in test}
    predictor = fit_predictor(train, seed=7)
    err = relative_errors(predictor, test)
    assert np.median(err) < 0.10, f"median relative error {np.median(err):.3f}"
    # and it is a real model: the closed-form guess is far off on the same requests
    guess = np.array([analytic_peak(p.shape) for p in test], dtype=float)
    actual = np.array([p.peak_bytes for p in test], dtype=float)
    assert np.median(np.abs(guess - actual) / actual) > 2 * np.median(err)


def test_numpy_export_equals_sklearn_and_survives_json(store, tmp_path):
    from sklearn.neural_network import MLPRegressor

    g = ensure_dataset(store, "bitcoin-otc")
    profiles = profile_requests(g, 30, seed=1, max_hops=2)
    pred = fit_predictor(profiles, seed=1)
    assert pred.w1.shape == (shape_features(np.zeros((1, 6))).shape[1], 16)
    # same weights in sklearn's forward pass
    x = shape_features(np.array([p.shape.as_row() for p in profiles]))
    mlp = MLPRegressor(hidden_layer_sizes=(16,))
    mlp.coefs_ = [pred.w1, pred.w2]
    mlp.intercepts_ = [pred.b1, pred.b2]
    mlp.n_layers_, mlp.out_activation_, mlp.activation = 3, "identity", "relu"
    mlp.n_outputs_ = 1
    z = mlp.predict((x - pred.x_mean) / pred.x_scale) * pred.y_scale + pred.y_mean
    rows = np.array([p.shape.as_row() for p in profiles])
    np.testing.assert_allclose(pred.predict_rows(rows), np.exp(z), rtol=1e-9)
    path = tmp_path / "p.json"
    pred.save(path)
    back = PeakPredictor.load(path)
    np.testing.assert_allclose(back.predict_rows(rows), pred.predict_rows(rows), rtol=1e-12)
    assert back.meta["profiles"] == len(profiles)


def test_shipped_predictor_loads_and_says_how_it_was_fitted():
    pred = PeakPredictor.load(bundled_predictor_path("bitcoin-otc"))
    assert pred.meta["graph"] == "bitcoin-otc" and pred.meta["heldout_median_rel_error"] < 0.10
    small = pred.predict(RequestShape(10, 50, 80, 128, "gcn"))
    big = pred.predict(RequestShape(1000, 5000, 30000, 128, "gcn"))
    assert 0 < small < big < 2**34


def test_bad_predictor_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        PeakPredictor.load(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InvalidRequest, match="not a gnn-faas peak predictor"):
        PeakPredictor.load(bad)
    d = PeakPredictor.load(bundled_predictor_path("bitcoin-otc")).to_dict()
    d["w1"] = d["w1"][:-1]
    bad.write_text(json.dumps(d))
    with pytest.raises(InvalidRequest, match="shapes"):
        PeakPredictor.load(bad)
    with pytest.raises(InvalidRequest, match="cannot read"):
        PeakPredictor.load(tmp_path / "missing.json")
    with pytest.raises(InvalidRequest, match="no peak model"):
        RequestShape(1, 1, 1, 1, "median").as_row()


def test_profile_cli_writes_a_loadable_predictor(store, tmp_path, capsys):
    out = tmp_path / "pred.json"
    argv = ["profile", "memory", "--store", store, "--graph", "bitcoin-otc",
            "--requests", "40", "--max-hops", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["profiles"] >= 40 and summary["out"] == str(out)
    assert PeakPredictor.load(out).meta["requests"] == 40
    assert main([*argv[:-2], "--test-fraction", "2", "--out", str(out)]) == 2

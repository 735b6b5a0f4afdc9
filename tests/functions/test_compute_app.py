"""The compute function app: Update stages and heads, and bad input -> 4xx JSON."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.compute_app import create_compute_app, default_threads
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.functions.update import UpdateModel
from gnn_faas.wire import FRAME_MIME, decode_frame, encode_frame

CONFIGS = {
    # layer 2 transforms first (16 -> 4 < 16): it has a pre stage
    "gcn": ModelConfig(arch="gcn", in_dim=12, hidden_dim=16, out_dim=4, num_layers=2),
    "sage": ModelConfig(arch="sage", in_dim=12, hidden_dim=16, out_dim=4, num_layers=2),
    "gat": ModelConfig(arch="gat", in_dim=12, hidden_dim=8, out_dim=4, num_layers=2, heads=2),
}
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        save_checkpoint(path, cfg, build_model(cfg, seed=1).state_dict())
        app = create_compute_app(str(path), device="cpu", threads=1)
        out[name] = (app.test_client(), UpdateModel.load(path, device="cpu"), path)
    return out


def rows(n, d):
    return RNG.standard_normal((n, d)).astype(np.float32)


def post(client, path, tensors, params):
    return client.post(path, data=encode_frame(tensors, params), content_type=FRAME_MIME)


def ok(resp):
    assert resp.status_code == 200, resp.get_json()
    assert resp.mimetype == FRAME_MIME
    return decode_frame(resp.data)[0]


def good_request_works(client, model):
    agg = rows(5, model.plan.step(1).agg_dim)
    root = rows(5, 12) if model.plan.step(1).return_root else None
    t = {"agg": agg} if root is None else {"agg": agg, "root": root}
    if model.config.arch == "gat":
        t = {"agg": RNG.standard_normal((5, 2, 8)).astype(np.float32)}
    out = ok(post(client, "/v1/update", t, {"layer": 1, "stage": "post"}))
    np.testing.assert_allclose(out["h"], model.post(1, t["agg"], t.get("root")), rtol=1e-6)


def test_health_and_model(models):
    client, model, _ = models["gcn"]
    assert client.get("/v2/health/live").get_json() == {"live": True}
    assert client.get("/v2/health/ready").get_json() == {"ready": True}
    info = client.get("/v1/model").get_json()
    assert ModelConfig.from_dict(info["config"]) == CONFIGS["gcn"]
    assert info["device"] == "cpu" and info["threads"] == 1
    assert [s["transform_first"] for s in info["plan"]] == [False, True]
    stats = client.get("/v1/stats").get_json()
    assert stats["device"] == "cpu" and stats["requests"] >= 0


def test_gcn_pre_and_post_equal_the_update_model(models):
    client, model, _ = models["gcn"]
    h = rows(7, 16)
    out = ok(post(client, "/v1/update", {"h": h}, {"layer": 2, "stage": "pre"}))
    np.testing.assert_allclose(out["h"], model.pre(2, h)["h"], rtol=1e-6)
    agg = rows(3, 4)
    out = ok(post(client, "/v1/update", {"agg": agg}, {"layer": 2, "stage": "post"}))
    np.testing.assert_allclose(out["h"], model.post(2, agg), rtol=1e-6)
    agg = rows(3, 12)
    out = ok(post(client, "/v1/update", {"agg": agg}, {"layer": 1, "stage": "post"}))
    np.testing.assert_allclose(out["h"], model.post(1, agg), rtol=1e-6)
    assert (out["h"] >= 0).all()  # ReLU after a hidden layer


def test_sage_post_with_root(models):
    client, model, _ = models["sage"]
    agg, root = rows(6, 12), rows(6, 12)
    out = ok(post(client, "/v1/update", {"agg": agg, "root": root}, {"layer": 1, "stage": "post"}))
    np.testing.assert_allclose(out["h"], model.post(1, agg, root), rtol=1e-6)


def test_gat_pre_returns_attention_terms(models):
    client, model, _ = models["gat"]
    x = rows(9, 12)
    out = ok(post(client, "/v1/update", {"h": x}, {"layer": 1, "stage": "pre"}))
    ref = model.pre(1, x)
    assert set(out) == {"h", "alpha_src", "alpha_dst"} and out["h"].shape == (9, 2, 8)
    for k in out:
        np.testing.assert_allclose(out[k], ref[k], rtol=1e-6)
    agg = RNG.standard_normal((4, 2, 4)).astype(np.float32)
    out = ok(post(client, "/v1/update", {"agg": agg}, {"layer": 2, "stage": "post"}))
    np.testing.assert_allclose(out["h"], model.post(2, agg), rtol=1e-6)


def test_heads(models):
    client, model, _ = models["gcn"]
    hu, hv = rows(5, 4), rows(5, 4)
    out = ok(post(client, "/v1/head", {"h_u": hu, "h_v": hv}, {"kind": "edge"}))
    np.testing.assert_allclose(out["score"], model.edge_scores(hu, hv), rtol=1e-6)
    h, seg = rows(6, 4), np.array([0, 0, 1, 2, 2, 2])
    out = ok(post(client, "/v1/head", {"h": h, "segments": seg}, {"kind": "graph"}))
    np.testing.assert_allclose(out["readout"], model.graph_readout(h, seg), rtol=1e-6)
    np.testing.assert_allclose(out["readout"][2], h[3:].mean(axis=0), rtol=1e-6)


def _bad_cases():
    f64 = np.zeros((3, 12))
    return {
        "wrong dtype": ("/v1/update", {"agg": f64}, {"layer": 1, "stage": "post"}, 400, "dtype"),
        "wrong width": ("/v1/update", {"agg": rows(3, 5)}, {"layer": 1, "stage": "post"}, 400,
                        "shape"),
        "wrong rank": ("/v1/update", {"agg": rows(3, 12)[None]}, {"layer": 1, "stage": "post"},
                       400, "shape"),
        "layer out of range": ("/v1/update", {"agg": rows(3, 12)}, {"layer": 9, "stage": "post"},
                               400, "layer"),
        "no pre stage": ("/v1/update", {"h": rows(3, 12)}, {"layer": 1, "stage": "pre"}, 400,
                         "no pre"),
        "bad stage": ("/v1/update", {"agg": rows(3, 12)}, {"layer": 1, "stage": "mid"}, 400,
                      "stage"),
        "missing tensor": ("/v1/update", {}, {"layer": 1, "stage": "post"}, 400, "'agg'"),
        "missing param": ("/v1/update", {"agg": rows(3, 12)}, {"stage": "post"}, 400, "'layer'"),
        "unexpected tensor": ("/v1/update", {"agg": rows(3, 12), "x": rows(1, 1)},
                              {"layer": 1, "stage": "post"}, 400, "unexpected"),
        "edge shapes": ("/v1/head", {"h_u": rows(3, 4), "h_v": rows(2, 4)}, {"kind": "edge"}, 400,
                        "same shape"),
        "segments range": ("/v1/head", {"h": rows(3, 4), "segments": np.array([0, 1, 10**12])},
                           {"kind": "graph"}, 400, "segments"),
        "segments dtype": ("/v1/head", {"h": rows(3, 4), "segments": np.zeros(3, np.float32)},
                           {"kind": "graph"}, 400, "segments"),
        "head kind": ("/v1/head", {"h": rows(3, 4)}, {"kind": "vertex"}, 400, "kind"),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input_is_4xx_json_and_the_instance_keeps_serving(models, case):
    client, model, _ = models["gcn"]
    path, tensors, params, status, fragment = _bad_cases()[case]
    resp = post(client, path, tensors, params)
    assert resp.status_code == status and resp.mimetype == "application/json"
    assert fragment in resp.get_json()["error"]
    good_request_works(client, model)


def test_sage_without_root_is_400(models):
    client, model, _ = models["sage"]
    resp = post(client, "/v1/update", {"agg": rows(2, 12)}, {"layer": 1, "stage": "post"})
    assert resp.status_code == 400 and "root" in resp.get_json()["error"]
    good_request_works(client, model)


def test_truncated_garbage_and_http_errors(models):
    client, model, _ = models["gcn"]
    body = encode_frame({"agg": rows(4, 12)}, {"layer": 1, "stage": "post"})
    for bad in (body[:-3], body[:5], b"\x00" * 8 + b"x"):
        resp = client.post("/v1/update", data=bad, content_type=FRAME_MIME)
        assert resp.status_code == 400 and "invalid frame" in resp.get_json()["error"]
        good_request_works(client, model)
    assert client.get("/v1/nope").status_code == 404
    resp = client.get("/v1/update")
    assert resp.status_code == 405 and "error" in resp.get_json()
    good_request_works(client, model)


def test_oversized_body_is_413(models):
    _, model, path = models["gcn"]
    client = create_compute_app(
        str(path), device="cpu", threads=1, max_body_bytes=2048
    ).test_client()
    resp = post(client, "/v1/update", {"agg": rows(100, 12)}, {"layer": 1, "stage": "post"})
    assert resp.status_code == 413 and "exceeds" in resp.get_json()["error"]
    good_request_works(client, model)


def test_thread_count(monkeypatch):
    monkeypatch.setenv("GNN_FAAS_THREADS", "3")
    assert default_threads(4) == 3
    monkeypatch.delenv("GNN_FAAS_THREADS")
    assert default_threads(1) >= default_threads(64) == 1


@pytest.mark.slow
def test_served_compute_function(models):
    """``gnn-faas serve compute`` as the platform starts it: ready, serving, clean SIGTERM."""
    import signal

    from gnn_faas.functions.client import ComputeClient
    from tests.functions.test_no_torch import instance, wait_ready

    _, model, path = models["gcn"]
    argv = ["serve", "compute", "--model", str(path), "--port", "0", "--threads", "1"]
    with instance(argv) as (proc, base):
        wait_ready(base)
        client = ComputeClient(base)
        info = client.model()
        assert info["threads"] == 1 and info["device"] in ("cpu", "cuda:0", "cuda")
        agg = rows(4, 12)
        np.testing.assert_allclose(client.post(1, agg), model.post(1, agg), rtol=1e-5)
        assert client.stats()["pid"] != proc.pid  # served by the worker, not the master
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.mark.slow
def test_served_compute_function_pulls_its_checkpoint_from_the_store(models, tmp_path):
    """``serve compute --store URI --model-name NAME``: how the chart's compute
    functions start without an init container. The pulled checkpoint serves the
    same numbers; a store without the model is a one-line error, exit 2."""
    import signal
    import subprocess

    from gnn_faas.functions.checkpoint_store import push_checkpoint
    from gnn_faas.functions.client import ComputeClient
    from tests.functions.test_no_torch import GNN_FAAS, instance, wait_ready

    _, model, path = models["gcn"]
    store = f"file://{tmp_path / 'store'}"
    push_checkpoint(store, path, "btc")
    dest = tmp_path / "scratch" / "model"
    argv = ["serve", "compute", "--store", store, "--model-name", "btc", "--model", str(dest),
            "--port", "0", "--threads", "1"]  # fmt: skip
    with instance(argv) as (proc, base):
        wait_ready(base)
        assert (dest / "config.json").is_file()
        client = ComputeClient(base)
        agg = rows(3, 12)
        np.testing.assert_allclose(client.post(1, agg), model.post(1, agg), rtol=1e-5)
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    for extra, message in (
        (["--store", store, "--model-name", "nope"], "holds no model 'nope'"),
        (["--store", store], "--store and --model-name go together"),
    ):
        r = subprocess.run([*GNN_FAAS, "serve", "compute", "--model", str(tmp_path / "m2"), *extra],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_post_with_pre_next_runs_the_next_layers_pre(models):
    """``pre_next``: one call answers what ``post`` of layer 1 then ``pre`` of
    layer 2 do (gat's attention terms too); a model whose next layer has no pre
    stage is a 400."""
    for name in ("gcn", "gat"):
        client, model, _ = models[name]
        step = model.plan.steps[0]
        shape = (5, step.heads, step.agg_dim // step.heads) if name == "gat" else (5, step.agg_dim)
        agg = RNG.standard_normal(shape).astype(np.float32)
        resp = post(client, "/v1/update", {"agg": agg}, {"layer": 1, "stage": "post",
                                                         "pre_next": True})  # fmt: skip
        assert resp.status_code == 200, resp.get_json()
        got, _ = decode_frame(resp.data)
        want = model.pre(2, model.post(1, agg))
        assert set(got) == set(want) and len(got) == (3 if name == "gat" else 1)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)
    client, model, _ = models["sage"]
    agg = rows(3, model.plan.steps[0].agg_dim)
    resp = post(client, "/v1/update", {"agg": agg, "root": rows(3, 12)},
                {"layer": 1, "stage": "post", "pre_next": True})  # fmt: skip
    assert resp.status_code == 400 and "no pre stage" in resp.get_json()["error"]

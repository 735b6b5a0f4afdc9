"""The compute function's device path: selection logic, transfers, the CPU
fallback of everything the GPU path does, and (marked ``gpu``) the GPU itself."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.compute_app import create_compute_app
from gnn_faas.functions.device import resolve_device, select_device
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.functions.update import UpdateModel

CONFIGS = {
    "gcn": ModelConfig(arch="gcn", in_dim=12, hidden_dim=16, out_dim=4, num_layers=2),
    "sage": ModelConfig(arch="sage", in_dim=12, hidden_dim=16, out_dim=4, num_layers=2),
    "gat": ModelConfig(arch="gat", in_dim=12, hidden_dim=8, out_dim=4, num_layers=2, heads=2),
}


@pytest.mark.parametrize(
    "requested,available,count,expected",
    [
        ("auto", True, 1, "cuda"),
        ("auto", False, 0, "cpu"),
        (None, False, 0, "cpu"),
        ("cpu", True, 2, "cpu"),
        ("cuda", True, 1, "cuda"),
        ("cuda:1", True, 2, "cuda:1"),
        ("CUDA:0", True, 1, "cuda:0"),
    ],
)
def test_resolve_device(requested, available, count, expected):
    assert resolve_device(requested, available, count) == expected


@pytest.mark.parametrize(
    "requested,available,count,match",
    [
        ("cuda", False, 0, "no CUDA device is visible"),
        ("cuda:3", True, 2, "only 2 CUDA"),
        ("tpu", True, 1, "auto, cpu, cuda"),
        ("cuda:x", True, 1, "auto, cpu, cuda"),
    ],
)
def test_resolve_device_errors(requested, available, count, match):
    with pytest.raises(InvalidRequest, match=match):
        resolve_device(requested, available, count)


def test_select_device_follows_this_machine():
    assert select_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert select_device("cpu") == "cpu"
    if not torch.cuda.is_available():  # an explicit GPU without one is an error, not a fallback
        with pytest.raises(InvalidRequest, match="no CUDA device"):
            select_device("cuda")


def test_device_parsing_does_not_import_torch():
    """The gunicorn master validates --device without torch (no CUDA before the fork)."""
    code = (
        "import sys; from gnn_faas.functions.device import parse_device; "
        "import gnn_faas.cli.serve; parse_device('cuda:0'); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        save_checkpoint(path, cfg, build_model(cfg, seed=1).state_dict())
        out[name] = path
    return out


def run_stages(model: UpdateModel, name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h = rng.standard_normal((9, 12)).astype(np.float32)
    out = {}
    if name == "gat":
        pre = model.pre(1, h)
        out.update({f"pre_{k}": v for k, v in pre.items()})
        agg = pre["h"][:5]
        out["post"] = model.post(1, agg)
    elif name == "sage":
        out["post"] = model.post(1, h[:4], h[5:])  # agg, root: two moves in, one out
    else:
        out["post"] = model.post(1, h)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cpu_path_moves_each_batch_once(name, checkpoints):
    model = UpdateModel.load(checkpoints[name], device="cpu")
    assert all(w.device.type == "cpu" for w in model.w.values())
    run_stages(model, name)
    t = model.transfers.as_dict()
    expected = {"gcn": (1, 1), "sage": (2, 1), "gat": (2, 4)}[name]  # gat: pre 1->3, post 1->1
    assert (t["to_device"], t["from_device"]) == expected
    assert t["bytes_to_device"] > 0 and t["bytes_from_device"] > 0


def test_compute_app_reports_device_and_transfers(checkpoints):
    client = create_compute_app(str(checkpoints["gcn"]), device="auto", threads=1).test_client()
    info = client.get("/v1/model").get_json()
    assert info["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert client.get("/v1/stats").get_json()["transfers"]["to_device"] == 0
    if not torch.cuda.is_available():
        with pytest.raises(InvalidRequest, match="no CUDA device"):
            create_compute_app(str(checkpoints["gcn"]), device="cuda", threads=1)


def test_serve_compute_rejects_a_bad_device(checkpoints, capsys):
    argv = ["serve", "compute", "--model", str(checkpoints["gcn"]), "--device", "tpu"]
    assert main(argv) == 2
    assert "device must be" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpu_update_equals_cpu(name, checkpoints, gpu_device):
    cpu = UpdateModel.load(checkpoints[name], device="cpu")
    gpu = UpdateModel.load(checkpoints[name], device=gpu_device)
    assert all(w.device.type == torch.device(gpu_device).type for w in gpu.w.values())
    a, b = run_stages(cpu, name), run_stages(gpu, name)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5)
    assert gpu.transfers.as_dict() == cpu.transfers.as_dict()


@pytest.mark.gpu
def test_gpu_compute_app(checkpoints, gpu_device):
    client = create_compute_app(str(checkpoints["gcn"]), device=gpu_device, threads=1).test_client()
    assert client.get("/v1/model").get_json()["device"] == gpu_device

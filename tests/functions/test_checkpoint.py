"""Checkpoints: safetensors + config.json round trip, torch-free config reads, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    expected_shapes,
    load_config,
    load_state,
    save_checkpoint,
)
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.functions.update import UpdateModel

REPO = Path(__file__).resolve().parents[2]


def config(arch="sage", **kw) -> ModelConfig:
    base = dict(
        arch=arch,
        in_dim=12,
        hidden_dim=8,
        out_dim=3,
        num_layers=2,
        num_classes=3,
        graph="cora",
        fanouts=(5, 3),
        extra={"test_accuracy": 0.5},
    )
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "arch, kw", [("gcn", {}), ("sage", {"aggr": "max"}), ("gin", {}), ("gat", {"heads": 3})]
)
def test_round_trip(arch, kw, tmp_path):
    cfg = config(arch, **kw)
    model = build_model(cfg, seed=0)
    # the reference model's state_dict has exactly the documented names and shapes
    want, optional = expected_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == {k: v for k, v in want.items() if k in got}
    assert set(want) - set(got) <= optional
    save_checkpoint(tmp_path, cfg, model.state_dict())
    assert sorted(p.name for p in tmp_path.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    assert load_config(tmp_path) == cfg
    state = load_state(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v)
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["graph"] == "cora"
    # the compute side loads it
    upd = UpdateModel.load(tmp_path)
    assert upd.device.type in ("cpu", "cuda") and upd.config == cfg


def test_load_config_does_not_import_torch(tmp_path):
    save_checkpoint(tmp_path, config(), build_model(config(), seed=1).state_dict())
    code = (
        "import sys\n"
        "from gnn_faas.functions.checkpoint import load_config\n"
        "from gnn_faas.functions.layer_plan import ModelPlan\n"
        f"cfg = load_config({str(tmp_path)!r})\n"
        "assert ModelPlan.from_config(cfg).steps[0].op == 'mean'\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_missing_files(tmp_path):
    with pytest.raises(NotFound, match="config.json is missing"):
        load_config(tmp_path / "nowhere")
    (tmp_path / CONFIG_FILE).write_text(config().to_json())
    with pytest.raises(NotFound, match="model.safetensors is missing"):
        load_state(tmp_path)
    with pytest.raises(NotFound):
        UpdateModel.load(tmp_path / "nowhere")


def test_corrupt_files(tmp_path):
    (tmp_path / CONFIG_FILE).write_text("{ not json")
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        load_config(tmp_path)
    (tmp_path / CONFIG_FILE).write_text(config().to_json())
    (tmp_path / WEIGHTS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    with pytest.raises(InvalidRequest, match="not a readable safetensors file"):
        load_state(tmp_path)


def test_weights_must_match_the_config(tmp_path):
    cfg = config()
    state = build_model(cfg, seed=0).state_dict()
    bad = dict(state)
    bad["convs.1.lin_l.weight"] = torch.zeros(4, 8)
    with pytest.raises(
        InvalidRequest, match=r"convs.1.lin_l.weight: \[4, 8\] \(expected \[3, 8\]\)"
    ):
        save_checkpoint(tmp_path, cfg, bad)
    missing = {k: v for k, v in state.items() if k != "convs.0.lin_r.weight"}
    with pytest.raises(InvalidRequest, match="missing.*convs.0.lin_r.weight"):
        save_checkpoint(tmp_path, cfg, missing)
    with pytest.raises(InvalidRequest, match="unexpected.*head.weight"):
        save_checkpoint(tmp_path, cfg, {**state, "head.weight": torch.zeros(1)})
    assert not (tmp_path / CONFIG_FILE).exists()  # nothing written on failure
    # a checkpoint whose weights disagree with its config is refused on load
    save_checkpoint(tmp_path, cfg, state)
    other = json.loads(cfg.to_json()) | {"hidden_dim": 9}
    (tmp_path / CONFIG_FILE).write_text(json.dumps(other))
    with pytest.raises(InvalidRequest, match="do not match the model"):
        load_state(tmp_path)


def test_numpy_state_dict_is_accepted(tmp_path):
    cfg = config("gcn")
    state = {k: v.numpy() for k, v in build_model(cfg, seed=3).state_dict().items()}
    save_checkpoint(tmp_path, cfg, state)
    loaded = load_state(tmp_path)
    np.testing.assert_array_equal(loaded["convs.0.lin.weight"].numpy(), state["convs.0.lin.weight"])

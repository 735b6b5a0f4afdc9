"""Checkpoints kept in the graph store (``gnn-faas model push|pull``)."""

from __future__ import annotations

import pytest

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.functions.checkpoint import load_config, load_state, save_checkpoint
from gnn_faas.functions.checkpoint_store import pull_checkpoint, push_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model


@pytest.fixture
def ckpt(tmp_path):
    cfg = ModelConfig(arch="gcn", in_dim=8, hidden_dim=4, out_dim=2, num_layers=2, num_classes=2)
    path = tmp_path / "btc"
    save_checkpoint(path, cfg, build_model(cfg, seed=2).state_dict())
    return path


def test_push_then_pull_is_the_same_checkpoint(store_uri, ckpt, tmp_path):
    n = push_checkpoint(store_uri, ckpt, "btc")
    assert n == sum(f.stat().st_size for f in ckpt.iterdir())
    out = pull_checkpoint(store_uri, "btc", tmp_path / "pulled")
    assert load_config(out) == load_config(ckpt)
    a, b = load_state(ckpt), load_state(out)
    assert set(a) == set(b) and all((a[k] == b[k]).all() for k in a)


def test_cli_push_and_pull(tmp_path, ckpt, capsys):
    store = f"file://{tmp_path / 'store'}"
    assert main(["model", "push", "--store", store, str(ckpt)]) == 0
    assert "as model 'btc'" in capsys.readouterr().out
    assert (
        main(["model", "pull", "--store", store, "--name", "btc", "--out", str(tmp_path / "o")])
        == 0
    )
    assert load_config(tmp_path / "o") == load_config(ckpt)
    assert main(["model", "pull", "--store", store, "--name", "nope", "--out", str(tmp_path)]) == 2
    assert "holds no model 'nope'" in capsys.readouterr().err


def test_bad_input(tmp_path, ckpt):
    store = f"file://{tmp_path / 'store'}"
    with pytest.raises(NotFound):
        push_checkpoint(store, tmp_path / "missing", "x")
    with pytest.raises(InvalidRequest):
        push_checkpoint(store, ckpt, "../escape")

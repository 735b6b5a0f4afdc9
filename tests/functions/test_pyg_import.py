"""``gnn-faas model import``: state_dict files of PyG models into checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from gnn_faas.cli import main
from gnn_faas.functions.checkpoint import load_config, load_state
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.functions.update import UpdateModel
from tests.functions.test_composition import cora_fetcher, pyg_full


def cfg(arch="gcn", **kw) -> ModelConfig:
    return ModelConfig(
        **{**dict(arch=arch, in_dim=20, hidden_dim=8, out_dim=4, num_layers=2), **kw}
    )


def run_import(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["model", "import", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_torch_save_and_safetensors_give_the_same_checkpoint(tmp_path, capsys):
    model = build_model(cfg("sage", aggr="max"), seed=0)
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    save_file(dict(model.state_dict()), str(tmp_path / "sd.safetensors"))
    for name in ("sd.pt", "sd.safetensors"):
        rc, out, _ = run_import(
            capsys,
            "--pyg",
            tmp_path / name,
            "--arch",
            "sage",
            "--aggr",
            "max",
            "--graph",
            "cora",
            "--out",
            tmp_path / name[3:],
        )
        assert rc == 0 and "imported sage" in out
    a, b = load_state(tmp_path / "pt"), load_state(tmp_path / "safetensors")
    assert a.keys() == b.keys() == model.state_dict().keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = load_config(tmp_path / "pt")
    # dimensions read from the weights
    assert (c.arch, c.aggr, c.in_dim, c.hidden_dim, c.out_dim, c.num_layers, c.graph) == (
        "sage",
        "max",
        20,
        8,
        4,
        2,
        "cora",
    )
    assert c.num_classes == 4 and c.extra["imported_from"] == "sd.pt"


def test_prefixed_and_old_gat_names(tmp_path, capsys):
    model = build_model(cfg("gat", heads=2, num_layers=3), seed=1)
    state = {}
    for k, v in model.state_dict().items():  # DataParallel prefix + PyG < 2.5 GATConv names
        if k.endswith("lin.weight"):
            state["module." + k.replace("lin.weight", "lin_src.weight")] = v
            state["module." + k.replace("lin.weight", "lin_dst.weight")] = v.clone()
        else:
            state["module." + k] = v
    torch.save(state, tmp_path / "old.pt")
    rc, _, err = run_import(
        capsys, "--pyg", tmp_path / "old.pt", "--arch", "gat", "--out", tmp_path / "ck"
    )
    assert rc == 0, err
    c = load_config(tmp_path / "ck")
    assert (c.heads, c.hidden_dim, c.num_layers, c.out_dim) == (2, 8, 3, 4)
    loaded = load_state(tmp_path / "ck")
    for k, v in model.state_dict().items():
        assert torch.equal(loaded[k], v)


def test_gin_eps_comes_from_the_weights(tmp_path, capsys):
    """A GIN with eps = 0.3 imports with that eps and still equals PyG on Cora."""
    fetcher = cora_fetcher(tmp_path / "store")
    c = ModelConfig(arch="gin", in_dim=1433, hidden_dim=16, out_dim=7, num_layers=2, eps=0.3)
    model = build_model(c, seed=2)
    save_file(dict(model.state_dict()), str(tmp_path / "gin.safetensors"))
    rc, _, err = run_import(
        capsys, "--pyg", tmp_path / "gin.safetensors", "--arch", "gin", "--out", tmp_path / "ck"
    )
    assert rc == 0, err
    update = UpdateModel.load(tmp_path / "ck", device="cpu")
    assert update.config.eps == pytest.approx(0.3)
    targets = np.arange(0, 2708, 97)
    cg = fetcher.fetch(targets, 2)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    np.testing.assert_allclose(
        out[cg.target_index], pyg_full(model, fetcher)[targets], rtol=1e-4, atol=1e-5
    )
    # an explicit --eps that contradicts the weights is refused
    rc, _, err = run_import(
        capsys,
        "--pyg",
        tmp_path / "gin.safetensors",
        "--arch",
        "gin",
        "--eps",
        "0",
        "--out",
        tmp_path / "ck2",
    )
    assert rc == 2 and "--eps 0.0 does not match the weights (0.3" in err


@pytest.mark.parametrize(
    "make, args, message",
    [
        ("gcn", ["--arch", "sage"], "sage weights need 'convs.0.lin_l.weight'"),
        ("gcn", ["--arch", "gcn", "--hidden", "9"], "--hidden 9 does not match the weights (8)"),
        ("gcn", ["--arch", "gcn", "--layers", "3"], "--layers 3 does not match the weights (2)"),
        ("gcn", ["--arch", "gcn", "--in-dim", "21"], "--in-dim 21 does not match"),
        ("stray", ["--arch", "gcn"], "weights outside the convs ModuleList"),
        ("gap", ["--arch", "gcn"], "expected layers convs.0 .. convs.L-1"),
        ("shape", ["--arch", "gcn"], "convs.0.bias: [3] (expected [8])"),
        ("ints", ["--arch", "gcn"], "weights must be floating point"),
        ("garbage", ["--arch", "gcn"], "neither safetensors nor a torch.save file"),
        ("module", ["--arch", "gcn"], "not a weights-only torch state_dict"),
        ("missing", ["--arch", "gcn"], "state_dict file not found"),
    ],
)
def test_bad_state_dicts_fail_with_one_line(make, args, message, tmp_path, capsys):
    model = build_model(cfg(), seed=0)
    state = dict(model.state_dict())
    path = tmp_path / "sd.pt"
    if make == "stray":
        state["classifier.weight"] = torch.zeros(2, 2)
    elif make == "gap":
        state = {k.replace("convs.1.", "convs.2."): v for k, v in state.items()}
    elif make == "shape":
        state["convs.0.bias"] = torch.zeros(3)
    elif make == "ints":
        state["convs.0.bias"] = torch.zeros(8, dtype=torch.int64)
    if make == "garbage":
        path.write_bytes(b"\x01\x02 this is not a state dict")
    elif make == "module":
        torch.save(model, path)  # a pickled module, refused by weights_only=True
    elif make != "missing":
        torch.save(state, path)
    rc, _, err = run_import(capsys, "--pyg", path, *args, "--out", tmp_path / "out")
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert message in err, err
    assert not (tmp_path / "out" / "config.json").exists()


def test_model_show(tmp_path, capsys):
    model = build_model(cfg(), seed=0)
    save_file(dict(model.state_dict()), str(tmp_path / "sd.safetensors"))
    rc, _, _ = run_import(
        capsys,
        "--pyg",
        tmp_path / "sd.safetensors",
        "--arch",
        "gcn",
        "--task",
        "embedding",
        "--fanouts",
        "5,5",
        "--out",
        tmp_path / "ck",
    )
    assert rc == 0
    assert main(["model", "show", str(tmp_path / "ck")]) == 0
    shown = ModelConfig.from_json(capsys.readouterr().out)
    assert shown.task == "embedding" and shown.fanouts == (5, 5) and shown.num_classes == 0
    assert main(["model", "show", str(tmp_path / "none")]) == 2
    assert "config.json is missing" in capsys.readouterr().err


def test_help_documents_the_module_layout(capsys):
    with pytest.raises(SystemExit):
        main(["model", "import", "--help"])
    text = capsys.readouterr().out
    assert "torch.nn.ModuleList" in text and "weights_only=True" in text

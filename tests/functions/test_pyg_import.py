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


# -- per-layer settings: any PyG model of the supported convs ----------------------


class Net(torch.nn.Module):
    """A user's PyG model: its own convs, ReLU between them."""

    def __init__(self, convs):
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = x.relu()
        return x


def _per_layer_models():
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    def mlp(d_in, h, d_out):
        return torch.nn.Sequential(
            torch.nn.Linear(d_in, h), torch.nn.ReLU(), torch.nn.Linear(h, d_out)
        )

    d = 1433
    return {
        # the common GAT setup: 4 heads concatenated, then 1 head (PyG's default concat=True)
        "gat-4-then-1": ([GATConv(d, 8, heads=4), GATConv(32, 7, heads=1)], []),
        "gat-4-then-1-mean": ([GATConv(d, 8, heads=4), GATConv(32, 7, heads=1, concat=False)], []),
        "gat-mixed": (
            [
                GATConv(d, 6, heads=4),
                GATConv(24, 5, heads=2, concat=False, negative_slope=0.1),
                GATConv(5, 4, heads=3, concat=True),  # last layer concatenates: 12 wide
            ],
            ["--negative-slope", "0.2,0.1,0.2"],
        ),
        "gat-no-bias": (
            [GATConv(d, 8, heads=3, bias=False), GATConv(24, 7, heads=2, concat=False)],
            [],
        ),
        "sage-per-layer": (
            [
                SAGEConv(d, 32, aggr="max"),
                SAGEConv(32, 12, aggr="mean", root_weight=False),
                SAGEConv(12, 7, aggr="max", bias=False),
            ],
            ["--aggr", "max,mean,max"],
        ),
        "gin-per-layer": (
            [
                GINConv(mlp(d, 24, 16), eps=0.1, train_eps=True),
                GINConv(mlp(16, 40, 7), eps=0.5, train_eps=True),
            ],
            [],
        ),
        "gcn-widths": ([GCNConv(d, 32), GCNConv(32, 9, bias=False), GCNConv(9, 7)], []),
    }


@pytest.mark.parametrize("name", list(_per_layer_models()))
def test_per_layer_settings_import_and_equal_pyg(name, tmp_path, capsys):
    """The imported model, served by Aggregate/Update, equals the PyG model."""
    torch.manual_seed(len(name))
    convs, flags = _per_layer_models()[name]
    model = Net(convs).eval()
    arch = name.split("-")[0]
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "m.st"))
    rc, out, err = run_import(
        capsys, "--pyg", tmp_path / "m.st", "--arch", arch, *flags, "--out", tmp_path / "ck"
    )
    assert rc == 0, err
    update = UpdateModel.load(tmp_path / "ck", device="cpu")
    config = update.config
    assert config.num_layers == len(convs)
    if arch == "gat":
        heads = [c.heads for c in convs]
        assert [lc.heads for lc in config.layer_settings()] == heads
        assert "heads " + ",".join(map(str, heads)) in out
    fetcher = cora_fetcher(tmp_path / "store")
    targets = np.arange(3, 2708, 101)
    cg = fetcher.fetch(targets, len(convs), degrees=True)
    got = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    ref = pyg_full(model, fetcher)
    assert got.shape[1] == ref.shape[1] == config.out_dim
    np.testing.assert_allclose(got[cg.target_index], ref[targets], rtol=1e-4, atol=1e-5)
    # the config file round-trips
    assert load_config(tmp_path / "ck") == config


def test_uniform_models_keep_the_uniform_config(tmp_path, capsys):
    model = build_model(cfg("gat", heads=2, num_layers=3), seed=1)
    save_file(dict(model.state_dict()), str(tmp_path / "m.st"))
    rc, _, err = run_import(
        capsys, "--pyg", tmp_path / "m.st", "--arch", "gat", "--out", tmp_path / "ck"
    )
    assert rc == 0, err
    c = load_config(tmp_path / "ck")
    assert c.layers is None and c.heads == 2
    assert '"layers"' not in (tmp_path / "ck" / "config.json").read_text()


def _unsupported():
    from torch_geometric.nn import GATConv, GATv2Conv, GINConv, SAGEConv

    bn = torch.nn.Sequential(
        torch.nn.Linear(20, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 4)
    )
    return [
        ("sage", [SAGEConv(20, 4, project=True)], "SAGEConv(project=True) is not supported"),
        ("gat", [GATConv(20, 4, edge_dim=3)], "GATConv(edge_dim=...) is not supported"),
        ("gat", [GATConv(20, 4, residual=True)], "GATConv(residual=True) is not supported"),
        ("gat", [GATv2Conv(20, 4)], "GATv2Conv (only GATConv is supported)"),
        ("gin", [GINConv(bn)], "must be Sequential(Linear, ReLU, Linear)"),
    ]


@pytest.mark.parametrize(("arch", "convs", "message"), _unsupported())
def test_unsupported_settings_are_named(arch, convs, message, tmp_path, capsys):
    torch.save(Net(convs).state_dict(), tmp_path / "m.pt")
    rc, _, err = run_import(
        capsys, "--pyg", tmp_path / "m.pt", "--arch", arch, "--out", tmp_path / "ck"
    )
    assert rc == 2 and message in err, err
    assert err.count("\n") == 1


def test_per_layer_flags_are_checked(tmp_path, capsys):
    from torch_geometric.nn import GATConv

    torch.save(
        Net([GATConv(20, 8, heads=4), GATConv(32, 4, heads=1)]).state_dict(), tmp_path / "m.pt"
    )
    for flags, message in [
        (["--heads", "4"], "--heads 4,4 does not match the weights (4,1)"),
        (["--heads", "4,1,2"], "--heads needs 1 or 2 values"),
        (["--concat", "false,true"], "--concat false for layer 0 does not match the weights"),
        (["--concat", "maybe"], "--concat takes true or false"),
        (["--negative-slope", "x"], "--negative-slope 'x'"),
    ]:
        rc, _, err = run_import(
            capsys, "--pyg", tmp_path / "m.pt", "--arch", "gat", *flags, "--out", tmp_path / "ck"
        )
        assert rc == 2 and message in err, (flags, err)
    rc, _, err = run_import(
        capsys,
        "--pyg",
        tmp_path / "m.pt",
        "--arch",
        "gat",
        "--heads",
        "4,1",
        "--out",
        tmp_path / "ck",
    )
    assert rc == 0, err


def test_help_says_what_is_supported(capsys):
    with pytest.raises(SystemExit):
        main(["model", "import", "--help"])
    text = capsys.readouterr().out
    for conv in ("GCNConv", "SAGEConv", "GINConv", "GATConv(in, out, heads=H, concat=True|False"):
        assert conv in text
    assert "Not supported" in text and "--concat" in text

"""ModelConfig validation/JSON, the per-layer plan and its byte accounting."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher

REPO = Path(__file__).resolve().parents[2]


def test_config_json_round_trip():
    cfg = ModelConfig(
        arch="gat",
        in_dim=1433,
        hidden_dim=8,
        out_dim=7,
        num_layers=2,
        heads=8,
        graph="cora",
        num_classes=7,
        fanouts=(10, 5),
        extra={"test_accuracy": 0.8},
    )
    text = cfg.to_json()
    d = json.loads(text)
    assert d["format"] == "gnn-faas-model" and d["normalization"] == "softmax"
    assert d["fanouts"] == [10, 5]
    back = ModelConfig.from_json(text)
    assert back == cfg and back.fanouts == (10, 5)
    # configs and plans can key caches (extra is not hashed)
    assert hash(ModelPlan.from_config(back)) == hash(ModelPlan.from_config(cfg))


def test_layer_dims():
    gcn = ModelConfig(arch="gcn", in_dim=100, hidden_dim=16, out_dim=7, num_layers=3)
    assert gcn.layer_dims() == [(100, 16), (16, 16), (16, 7)]
    gat = ModelConfig(arch="gat", in_dim=100, hidden_dim=8, out_dim=7, num_layers=3, heads=4)
    assert gat.layer_channels() == [(100, 8), (32, 8), (32, 7)]
    assert gat.layer_dims() == [(100, 32), (32, 32), (32, 7)]  # last layer averages heads


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arch": "gcnn"}, "arch must be one of"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"in_dim": "8"}, "in_dim must be a positive integer"),
        ({"arch": "sage", "aggr": "sum"}, "sage aggr"),
        ({"heads": 2}, "heads applies to gat only"),
        ({"fanouts": [10]}, "one fanout per layer"),
        ({"fanouts": [10, 2.5]}, "fanouts must be integers"),
        ({"num_classes": 3}, "must equal num_classes"),
        ({"task": "link"}, "task must be one of"),
        ({"eps": float("nan")}, "eps must be a finite number"),
    ],
)
def test_config_validation(change, message):
    base = dict(arch="gcn", in_dim=8, hidden_dim=4, out_dim=2, num_layers=2)
    with pytest.raises(InvalidRequest, match=message):
        ModelConfig(**{**base, **change})
    d = json.loads(ModelConfig(**base).to_json()) | change
    with pytest.raises(InvalidRequest, match=message):
        ModelConfig.from_json(json.dumps(d))


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"arch": "gcn"}', "missing keys"),
        (
            '{"arch": "gcn", "in_dim": 1, "hidden_dim": 1, "out_dim": 1, "num_layers": 1, '
            '"colour": 1}',
            "unknown keys",
        ),
        ('{"format": "other"}', "not a gnn-faas model config"),
        ('{"version": 9}', "unsupported model config version"),
    ],
)
def test_config_from_bad_json(text, message):
    with pytest.raises(InvalidRequest, match=message):
        ModelConfig.from_json(text)


def test_plan_steps_per_arch():
    gcn = ModelPlan.from_config(
        ModelConfig(arch="gcn", in_dim=1433, hidden_dim=64, out_dim=7, num_layers=3)
    )
    # layer 1 aggregates first (its rows are on the memory side); 64 -> 64 keeps the
    # width either way (aggregate first); 64 -> 7 narrows, so transform first.
    assert [s.transform_first for s in gcn.steps] == [False, False, True]
    assert [s.agg_dim for s in gcn.steps] == [1433, 64, 7]
    assert [s.pre for s in gcn.steps] == [False, False, True]
    assert all(s.needs_degrees and s.op == "gcn" for s in gcn.steps)
    assert [s.last for s in gcn.steps] == [False, False, True]
    # a widening layer after layer 1 aggregates first
    wide = ModelPlan.from_config(
        ModelConfig(arch="gcn", in_dim=8, hidden_dim=64, out_dim=4, num_layers=3)
    )
    assert [s.transform_first for s in wide.steps] == [False, False, True]
    sage = ModelPlan.from_config(
        ModelConfig(arch="sage", aggr="max", in_dim=10, hidden_dim=16, out_dim=3, num_layers=2)
    )
    assert [s.op for s in sage.steps] == ["max", "max"]
    assert all(s.return_root and not s.pre for s in sage.steps)
    gin = ModelPlan.from_config(
        ModelConfig(arch="gin", eps=0.5, in_dim=10, hidden_dim=16, out_dim=3, num_layers=2)
    )
    assert [(s.op, s.eps) for s in gin.steps] == [("gin", 0.5), ("gin", 0.5)]
    gat = ModelPlan.from_config(
        ModelConfig(arch="gat", heads=4, in_dim=10, hidden_dim=8, out_dim=3, num_layers=2)
    )
    assert all(s.pre and s.needs_alpha and s.heads == 4 for s in gat.steps)
    assert [s.agg_dim for s in gat.steps] == [32, 12]  # [n, heads, C] rows before the mean
    assert gat.step(2).last and gat.step(2).out_dim == 3
    with pytest.raises(InvalidRequest):
        gat.step(3)


@pytest.fixture(scope="module")
def cora_cg(tmp_path_factory):
    store = "file://" + str(tmp_path_factory.mktemp("store"))
    fetcher = KHopFetcher(ensure_dataset(store, "cora"))
    targets = np.random.default_rng(0).choice(2708, 64, replace=False)
    return fetcher.fetch(targets, 3)


def test_gcn_order_moves_fewer_bytes(cora_cg):
    """On a real Cora computation graph, the chosen order of every GCN layer
    moves no more bytes than the other order."""
    sizes = cora_cg.layer_sizes
    for dims in [(1433, 64, 7), (1433, 16, 7), (32, 256, 4)]:
        cfg = ModelConfig(
            arch="gcn", in_dim=dims[0], hidden_dim=dims[1], out_dim=dims[2], num_layers=3
        )
        plan = ModelPlan.from_config(cfg)
        for step in plan.steps:
            n_src, n_dst = sizes[step.layer - 1], sizes[step.layer]
            tf = not step.transform_first
            other = dataclasses.replace(
                step, transform_first=tf, pre=tf, agg_dim=step.out_dim if tf else step.in_dim
            )
            assert step.bytes_moved(n_src, n_dst) <= other.bytes_moved(n_src, n_dst)
        total = plan.bytes_moved(sizes)
        assert total == sum(s.bytes_moved(sizes[s.layer - 1], sizes[s.layer]) for s in plan.steps)
    # explicit count for a 2-layer 1433-16-7 GCN: layer 1 returns n_1 x 1433 rows;
    # layer 2 (transform first) sends n_1 x 7 and returns n_2 x 7
    plan = ModelPlan.from_config(
        ModelConfig(arch="gcn", in_dim=1433, hidden_dim=16, out_dim=7, num_layers=2)
    )
    n0, n1, n2 = 500, 40, 5
    assert plan.bytes_moved((n0, n1, n2)) == 4 * (n1 * 1433 + n1 * 7 + n2 * 7)
    with pytest.raises(InvalidRequest):
        plan.bytes_moved((n0, n1))


def test_memory_side_modules_import_without_torch():
    code = (
        "import sys\n"
        "import gnn_faas.functions.aggregate, gnn_faas.functions.layer_plan\n"
        "import gnn_faas.functions.executor, gnn_faas.functions.model_config\n"
        "from gnn_faas.functions.checkpoint import load_config\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)

"""``gnn-faas size`` -> ``gnn-faas chart-values`` -> the chart's function sizes."""

from __future__ import annotations

import json

import pytest
import yaml

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.sizing.chart import sizing_values

REPORT = {
    "memory_mb": {"aggregate-1": 192, "update-1": 384, "aggregate-2": 256, "update-2": 320},
    "bayes_opt": {
        "cores": {"aggregate-1": 0.5, "update-1": 1.0, "aggregate-2": 0.25, "update-2": 1.75}
    },  # fmt: skip
    "exhaustive": {
        "cores": {"aggregate-1": 0.75, "update-1": 1.0, "aggregate-2": 0.5, "update-2": 2.0}
    },  # fmt: skip
}


@pytest.mark.parametrize(
    "solver, memory, compute",
    [
        ("bayes_opt", {"cpu": "500m", "memoryMb": 256}, {"cpu": "1750m", "memoryMb": 384}),
        ("exhaustive", {"cpu": "750m", "memoryMb": 256}, {"cpu": "2", "memoryMb": 384}),
    ],
)
def test_each_kind_fits_its_largest_stage(solver, memory, compute):
    v = sizing_values(REPORT, "btc", solver)
    assert v == {"sizing": {"btc": {"memory": memory, "compute": compute}}}


@pytest.mark.parametrize(
    "report, match",
    [
        ({}, "not a `gnn-faas size` report"),
        ({"memory_mb": {}, "bayes_opt": {"cores": {"shuffle-1": 1}}}, "unknown stage"),
        ({"memory_mb": {}, "bayes_opt": {"cores": {"update-1": 1}}}, "no memory_mb"),
        ({"memory_mb": {"update-1": 128}, "bayes_opt": {"cores": {"update-1": 1}}}, "memory"),
    ],
)
def test_bad_reports_are_clear_errors(report, match):
    with pytest.raises(InvalidRequest, match=match):
        sizing_values(report, "btc")


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["chart-values", "--size", str(bad), "--model", "m"]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["chart-values", "--size", str(tmp_path / "missing"), "--model", "m"]) == 2


@pytest.mark.slow
def test_real_size_output_becomes_the_knative_resources(tmp_path, capsys):
    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model
    from gnn_faas.storage.datasets import ensure_dataset
    from tests.kube import render

    store = f"file://{tmp_path / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(arch="gcn", in_dim=graph.manifest.feature_dim, hidden_dim=32,
                      out_dim=2, num_layers=2, num_classes=2)  # fmt: skip
    save_checkpoint(tmp_path / "ckpt", cfg, build_model(cfg, seed=1).state_dict())
    argv = ["size", "--store", store, "--model", str(tmp_path / "ckpt"), "--targets", "8",
            "--repeats", "2"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    (tmp_path / "size.json").write_text(json.dumps(report))
    out = tmp_path / "sizing.yaml"
    argv = ["chart-values", "--size", str(tmp_path / "size.json"), "--model", "bitcoin-otc",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    values = yaml.safe_load(out.read_text())
    sizes = values["sizing"]["bitcoin-otc"]
    objs = render(values)
    for o in objs:
        if o["kind"] != "Service" or o["apiVersion"] != "serving.knative.dev/v1":
            continue
        kind = o["metadata"]["labels"]["gnn-faas.io/function-kind"]
        res = o["spec"]["template"]["spec"]["containers"][0]["resources"]
        want = sizes[kind]
        assert res["limits"] == {"cpu": want["cpu"], "memory": f"{want['memoryMb']}Mi"}
        stages = [s for s in report["memory_mb"] if s.startswith(
            "aggregate" if kind == "memory" else "update")]  # fmt: skip
        assert want["memoryMb"] == max(report["memory_mb"][s] for s in stages)

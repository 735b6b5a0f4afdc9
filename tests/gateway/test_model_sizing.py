"""Each model's functions are sized on their own (the chart's ``sizing``): the
memory budget its partitions are planned against is its own memory function's,
not the platform-wide default."""

from __future__ import annotations

from types import SimpleNamespace

import yaml

from gnn_faas.config import ServingConfig, from_dict
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.gateway.data_plane import DataPlane
from gnn_faas.storage.datasets import ensure_dataset
from tests.kube import render


def test_partition_budget_follows_the_models_own_memory_function(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    g = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(arch="gcn", in_dim=g.manifest.feature_dim, hidden_dim=8, out_dim=2,
                      num_layers=2, num_classes=2, graph="bitcoin-otc")  # fmt: skip
    save_checkpoint(tmp_path / "ckpt", cfg, build_model(cfg, seed=1).state_dict())
    common = {"graph": "bitcoin-otc", "dataset": None, "checkpoint": str(tmp_path / "ckpt")}
    serving = from_dict(ServingConfig, {
        "store": store,
        "platform": {"memory_function_mb": 512, "memory_vcpus": 1.0, "min_instances": 0},
        "models": [{"name": "big", **common},
                   {"name": "small", "memory_function_mb": 200, "memory_vcpus": 0.5,
                    "compute_function_mb": 700, **common}],
    })  # fmt: skip
    # no instance is launched here: the platform is only shut down at the end
    dp = DataPlane(
        serving, platform=SimpleNamespace(shutdown=lambda: None, addresses_instances=True)
    )
    try:
        big, small = dp.models["big"], dp.models["small"]
        assert big.memory_spec.memory_mb == 512 and big.orchestrator.budget_bytes == 512 * 2**20
        assert small.memory_spec.memory_mb == 200 and small.memory_spec.vcpus == 0.5
        assert small.orchestrator.budget_bytes == 200 * 2**20
        assert small.compute_spec.memory_mb == 700
    finally:
        dp.shutdown()


def test_chart_writes_each_models_sizes_into_the_serving_config():
    values = {
        "models": [{"name": "big", "graph": "g"}, {"name": "small", "graph": "g"}],
        "sizing": {"small": {"memory": {"cpu": "500m", "memoryMb": 200}}},
    }
    cm = next(o for o in render(values) if o["kind"] == "ConfigMap")
    text = cm["data"]["serving.yaml"].replace("${GNN_FAAS_STORE}", "s3://x")
    cfg = from_dict(ServingConfig, yaml.safe_load(text))
    small, big = cfg.model("small"), cfg.model("big")
    assert (small.memory_function_mb, small.memory_vcpus) == (200, 0.5)
    assert (big.memory_function_mb, big.memory_vcpus) == (512, 1.0)
    assert small.compute_function_mb == big.compute_function_mb == 1024

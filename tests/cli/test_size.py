"""``gnn-faas size``: real stage profiles of a model -> cores by bayes_opt vs exhaustive."""

from __future__ import annotations

import json

import pytest

from gnn_faas.cli import main
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.scheduler.sizing.latency_profile import LatencyProfile
from gnn_faas.storage.datasets import ensure_dataset

pytestmark = pytest.mark.slow


def test_size_profiles_stages_and_bayes_opt_is_near_exhaustive(tmp_path, capsys):
    store = f"file://{tmp_path / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(arch="sage", in_dim=graph.manifest.feature_dim, hidden_dim=32,
                      out_dim=2, num_layers=2, num_classes=2)  # fmt: skip
    save_checkpoint(tmp_path / "ckpt", cfg, build_model(cfg, seed=1).state_dict())
    profile_path = tmp_path / "profile.json"
    argv = ["size", "--store", store, "--model", str(tmp_path / "ckpt"), "--targets", "8",
            "--repeats", "2", "--profile-out", str(profile_path)]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    stages = {"aggregate-1", "update-1", "aggregate-2", "update-2"}
    assert set(out["memory_mb"]) == stages
    assert all(mb >= 128 and mb % 64 == 0 for mb in out["memory_mb"].values())
    bo, ex = out["bayes_opt"], out["exhaustive"]
    assert bo["feasible"] and ex["feasible"]
    assert bo["total_latency_s"] <= bo["budget_s"] == pytest.approx(0.3 - 0.15)
    assert set(bo["cores"]) == stages
    assert ex["cost"] <= bo["cost"] <= 1.10 * ex["cost"]
    profile = LatencyProfile.load(profile_path)
    assert set(profile.stages()) == stages
    # a quarter core is four times slower than one core (a CPU quota)
    t1 = profile.latency("aggregate-1", 1.0, out["layer_sizes"][1])
    assert profile.latency("aggregate-1", 0.25, out["layer_sizes"][1]) == pytest.approx(4 * t1)
    # the sizes as a serving config's model keys: the largest stage of each kind
    serving = out["serving"]
    assert serving["memory_function_mb"] == max(out["memory_mb"][f"aggregate-{i}"] for i in (1, 2))
    assert serving["compute_function_mb"] == max(out["memory_mb"][f"update-{i}"] for i in (1, 2))
    assert serving["memory_vcpus"] == max(bo["cores"][f"aggregate-{i}"] for i in (1, 2))
    assert serving["compute_vcpus"] == max(bo["cores"][f"update-{i}"] for i in (1, 2))
    assert serving["fanouts"] is None  # the checkpoint's: full neighbourhoods
    # sampled as a serving config's fanouts: each hop holds at most 3 neighbours a vertex
    assert main(argv + ["--fanouts", "3,3"]) == 0
    sampled = json.loads(capsys.readouterr().out)
    sizes = sampled["layer_sizes"]
    assert sizes[2] <= 8 and sizes[1] <= sizes[2] * 4 and sizes[0] <= sizes[1] * 4
    assert sizes[0] < out["layer_sizes"][0]
    assert sampled["serving"]["fanouts"] == [3, 3]
    assert main(argv + ["--fanouts", "3"]) == 2  # one fanout per layer
    assert "one fanout per hop" in capsys.readouterr().err


def test_size_rejects_a_timeout_beyond_the_slo(tmp_path, capsys):
    argv = ["size", "--model", str(tmp_path), "--slo", "0.1", "--timeout", "0.2"]
    assert main(argv) == 2
    assert "timeout" in capsys.readouterr().err

"""scripts/gpu-check.sh: its no-CUDA path (one line, exit 0, nothing run), its whole run with
the CPU standing in for the GPU (GNN_FAAS_GPU_CHECK_DEVICE=cpu), and its dependency step."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
_spec = importlib.util.spec_from_file_location(
    "gnn_faas_gpu_check", ROOT / "scripts" / "gpu_check.py"
)
gpu_check = sys.modules["gnn_faas_gpu_check"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


def run(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GNN_FAAS_GPU_CHECK")}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**base, "PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=timeout, cwd="/",
    )  # fmt: skip


@no_cuda
def test_without_cuda_it_says_so_in_one_line_and_runs_nothing(tmp_path):
    done = run({"OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu-check: no CUDA here (no /dev/nvidia*, no nvidia-smi): nothing run"
    ]
    assert done.stderr == "" and list(tmp_path.iterdir()) == []


@no_cuda
def test_with_an_nvidia_tool_but_no_cuda_torch_decides(tmp_path):
    """Where nvidia-smi exists but torch sees no device, torch's answer is the one line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 9\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    out.mkdir()
    done = run({"OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu-check: no CUDA here (torch.cuda.is_available() is False): nothing run"
    ]
    assert list(out.iterdir()) == []


def test_missing_requirements_are_those_not_installed_or_too_old():
    have = {"flask": "3.1.0", "numpy": "1.20.0", "scipy": "1.11.0"}
    missing = gpu_check.missing_requirements(
        ["flask>=3.0", "numpy>=1.24", "scipy>=1.10", "gunicorn>=21", "tomli; python_version<'3'"],
        have.get,
    )
    assert missing == ["numpy>=1.24", "gunicorn>=21"]
    # this venv holds the whole core
    assert (
        gpu_check.missing_requirements(gpu_check.core_requirements(), gpu_check.installed_version)
        == []
    )


def test_missing_dependencies_without_the_wheels_say_what_to_carry(tmp_path):
    """A Python lacking the core and no carried wheels: exit 2 naming both, nothing run."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = run({
        "PYTHON": str(venv / "bin" / "python"), "GNN_FAAS_GPU_CHECK_DEVICE": "cpu",
        "GNN_FAAS_GPU_WHEELS": str(tmp_path / "none"), "OUT": str(tmp_path),
    })  # fmt: skip
    assert done.returncode == 2
    assert "lacks numpy>=1.24" in done.stderr and "flask>=3.0" in done.stderr
    assert "run make gpu-wheels" in done.stderr and not (tmp_path / "gpu-check.json").exists()


@pytest.mark.slow
def test_the_whole_check_with_the_cpu_standing_in(tmp_path):
    out = tmp_path / "check.json"
    done = run({"GNN_FAAS_GPU_CHECK_DEVICE": "cpu", "GNN_FAAS_GPU_CHECK_QUICK": "1"}, str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert json.loads(done.stdout) == doc
    assert doc["ok"] and doc["problems"] == [] and doc["stand_in"] and doc["device"] == "cpu"
    tests = doc["gpu_tests"]
    assert tests["files"] == ["tests/functions/test_device.py"]
    assert tests["passed"] == tests["tests"] >= 4 and tests["skipped"] == 0 and tests["rc"] == 0
    serve = doc["serve"]
    assert serve["compute_device"] == {"bitcoin-otc-gpu": "cpu", "bitcoin-otc-cpu": "cpu"}
    assert [r["targets"] for r in serve["requests"]] == [1, 16, 256]
    assert all(r["equal"] and r["shape"][0] == r["targets"] for r in serve["requests"])
    # the gateway predicted each request's size from the stored PSGS before its fetch
    assert all(r["predicted_rows"] >= r["aggregated_rows"] > 0 for r in serve["requests"][1:])
    bench = doc["update_bench"]
    assert {r["series"] for r in bench} == {"bitcoin-otc", "reddit-like"}
    assert max(r["rows"] for r in bench if r["series"] == "bitcoin-otc") == 5881
    assert all(r["equal"] and r["cpu_s"] > 0 and r["device_s"] > 0 for r in bench)
    for series in ("bitcoin-otc", "reddit-like"):
        p = doc["placement"][series]
        rows = [r["rows"] for r in bench if r["series"] == series]
        assert [c["rows"] for c in p["choices"]] == rows
        t = p["threshold_rows"]
        for c in p["choices"]:  # the choice is the threshold's, whatever was measured
            assert c["chosen"] == ("cpu" if t is None or c["rows"] < t else "cuda")
    buffers = doc["placement"]["bitcoin-otc"]["buffers"]
    assert [b["requests"] for b in buffers] == [1, 16, 256, 4096]
    predicted = [b["predicted_rows"] for b in buffers]
    assert predicted == sorted(predicted) and predicted[0] > 0

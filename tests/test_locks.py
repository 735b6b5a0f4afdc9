"""The lock files under locks/ match pyproject.toml (scripts/lock.py's offline check), and the
check catches each way they can drift apart."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gnn_faas_lock", ROOT / "scripts" / "lock.py")
lock = sys.modules["gnn_faas_lock"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


@pytest.fixture
def copy(tmp_path) -> Path:
    """pyproject.toml and locks/ as committed, to edit."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "locks", tmp_path / "locks")
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_committed_locks_match_pyproject():
    assert lock.check(ROOT) == []


def test_every_target_has_a_lock_with_hashes_and_the_torch_rule_holds():
    for target in lock.TARGETS:
        parsed = lock.read_lock(ROOT / target.path)
        assert parsed.pins, target.name
        assert min(parsed.hashes.values()) >= 1, target.name
        # torch and its CUDA runtime never come through a lock resolved from the index
        assert not [n for n in parsed.pins if n == "torch" or n.startswith("nvidia-")]
    torch = lock.read_lock(ROOT / lock.TORCH_LOCK)
    assert list(torch.pins) == ["torch"] and Version(torch.pins["torch"]).local == "cpu"
    # the dev and compute locks hold what the CPU wheel itself requires (read from that wheel)
    for name in ("dev", "compute"):
        pins = lock.read_lock(ROOT / f"locks/{name}.txt").pins
        assert {"sympy", "networkx", "filelock", "jinja2", "fsspec"} <= set(pins), name
    # the memory and gateway images hold no torch and none of its dependencies
    for name in ("memory", "gateway"):
        assert "sympy" not in lock.read_lock(ROOT / f"locks/{name}.txt").pins


def test_a_narrowed_specifier_fails_the_check(copy):
    pinned = lock.read_lock(copy / "locks/memory.txt").pins["numpy"]
    edit(copy / "pyproject.toml", '"numpy>=1.24"', '"numpy>=999"')
    problems = lock.check(copy)
    for name in ("dev", "memory", "compute", "gateway", "gpu"):
        assert (
            f"locks/{name}.txt was compiled from other inputs than pyproject.toml's: run make lock"
            in problems
        )
    assert f"locks/memory.txt: numpy=={pinned} does not satisfy numpy>=999" in problems
    # the gpu lock leaves numpy to the GPU machine: no pin to judge there
    assert not [p for p in problems if p.startswith("locks/gpu.txt: numpy")]
    assert not [p for p in problems if p.startswith("locks/build.txt")]


def test_a_new_dependency_fails_the_check(copy):
    edit(copy / "pyproject.toml", 'redis = ["redis>=5"]', 'redis = ["redis>=5", "hiredis>=3"]')
    problems = lock.check(copy)
    for name in ("memory", "compute", "gateway", "dev"):
        assert f"locks/{name}.txt: hiredis>=3 is not pinned: run make lock" in problems
    assert not [p for p in problems if "gpu.txt" in p or "build.txt" in p]


def test_a_torch_bound_the_cpu_wheel_misses_fails_the_check(copy):
    edit(copy / "pyproject.toml", 'compute = ["torch>=2.1"]', 'compute = ["torch>=3"]')
    problems = lock.check(copy)
    assert f"locks/compute.txt: torch=={lock.TORCH_PIN} does not satisfy torch>=3" in problems
    assert (
        f"{lock.TORCH_LOCK} was compiled from other inputs than pyproject.toml's: run make lock"
        in problems
    )


def test_a_missing_hash_a_missing_lock_and_a_double_pin_fail_the_check(copy):
    text = (copy / "locks/gateway.txt").read_text()
    (copy / "locks/gateway.txt").write_text(re.sub(r" \\\n\s+--hash=sha256:\w+", "", text))
    (copy / "locks/build.txt").unlink()
    memory = copy / "locks/memory.txt"
    memory.write_text(memory.read_text() + "numpy==1.0 \\\n    --hash=sha256:00\n")
    problems = lock.check(copy)
    assert [p for p in problems if p.startswith("locks/gateway.txt: flask==") and "no --hash" in p]
    assert "locks/build.txt is missing: run make lock" in problems
    assert "memory.txt: numpy pinned twice" in problems

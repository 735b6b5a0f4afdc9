"""``gnn-faas up --platform docker`` with bad input: one clear line and exit 2,
fast, before anything is served."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow


def up(tmp_path, config: dict, env: dict | None = None, *extra: str) -> tuple[int, str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "gnn_faas", "up", "--config", str(cfg), "--port", "0", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
    )
    return proc.returncode, proc.stderr


def test_unreachable_engine(tmp_path):
    code, err = up(
        tmp_path, {"platform": {"kind": "docker"}}, {"DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    )
    assert code == 2 and "no Docker engine answers" in err and "Traceback" not in err, err


def test_missing_image(tmp_path, docker_host):
    config = {"platform": {"docker": {"compute_image": "gnn-faas-compute:missing"}}}
    code, err = up(tmp_path, config, None, "--platform", "docker")
    assert code == 2 and "Traceback" not in err, err
    assert "gnn-faas-compute:missing not found" in err and "make images" in err


def test_unknown_platform(tmp_path):
    code, err = up(tmp_path, {}, None, "--platform", "nope")
    assert code == 2 and "unknown platform 'nope'" in err and "docker" in err

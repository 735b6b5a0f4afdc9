"""A Docker engine and the project's images for the container tests.

:func:`docker_engine` starts (or finds) an engine with ``scripts/docker-engine.sh``,
the script ``make images`` uses: an engine that ``$DOCKER_HOST`` names and that
answers is used as is; otherwise a private dockerd under ``build/docker`` (no
network configuration touched; containers use ``--network host``), stopped again
at the end when this session started it. The images are built with
``make images`` when the engine lacks one. If no engine can be started at all
(no root, no apt, no kernel support) the container tests are skipped with the
script's own explanation; on CI and on the development machine it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = REPO / "scripts" / "docker-engine.sh"
STATE = REPO / "build" / "docker"
IMAGES = ("gnn-faas-memory:latest", "gnn-faas-compute:latest", "gnn-faas-gateway:latest")


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ENGINE), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@contextlib.contextmanager
def docker_engine() -> Iterator[str]:
    """Yield a ``DOCKER_HOST`` that answers, with the images built in it."""
    if shutil.which("bash") is None:
        pytest.skip("the container tests need bash to start a Docker engine")
    started = _run("running", str(STATE)).returncode != 0
    try:
        res = _run("start", str(STATE))
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no Docker engine could be started: {exc}")
    if res.returncode != 0:
        pytest.skip(f"no Docker engine could be started: {res.stderr.strip()[-1500:]}")
    host = res.stdout.strip()
    started = started and _run("running", str(STATE)).returncode == 0
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DOCKER_HOST", host)
            _ensure_images(host)
            yield host
    finally:
        if started:
            _run("stop", str(STATE), timeout=120)


def _ensure_images(host: str) -> None:
    import docker

    client = docker.DockerClient(base_url=host)
    try:
        missing = []
        for tag in IMAGES:
            try:
                client.images.get(tag)
            except docker.errors.ImageNotFound:
                missing.append(tag)
    finally:
        client.close()
    if missing:
        # make images builds into the engine DOCKER_HOST names (ours, now)
        env = {**os.environ, "DOCKER_HOST": host}
        res = subprocess.run(
            ["make", "-s", "images"], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert res.returncode == 0, f"make images failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"


def readable_dir(prefix: str) -> Path:
    """A fresh directory that the containers' user (uid 10001) can read: pytest's
    own temporary directories are private (0700) to the user running the tests."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    for parent in path.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:  # pragma: no cover - odd TMPDIR
            pytest.skip(f"{parent} is not traversable by other users; set TMPDIR elsewhere")
    return path

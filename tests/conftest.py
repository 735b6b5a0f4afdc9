"""Shared fixtures: real Redis and S3 (moto) servers, and a fresh store of each kind.

- ``redis_url``: ``redis://127.0.0.1:P/0`` of a session-wide ``redis-server``.
- ``s3_env``: a session-wide moto S3 server with the AWS environment pointing at
  it (restored afterwards) and a bucket; yields the base ``s3://BUCKET/PREFIX``.
- ``store_uri``: a fresh, empty store URI of each kind (``file``, ``s3``,
  ``redis``), unique per test; servers start only when a test needs them.
- ``docker_host``: a session-wide Docker engine with the project's images
  (tests/docker_engine.py); ``DOCKER_HOST`` points at it for the session.
"""

from __future__ import annotations

import os
import tracemalloc
import uuid
from collections.abc import Iterator

import pytest

from tests.docker_engine import docker_engine
from tests.servers import moto_server, redis_server


@pytest.fixture(autouse=True)
def _tracemalloc_isolated() -> Iterator[None]:
    """A test that starts tracemalloc (to measure a call's whole peak) leaves it
    running; stop it after the test so later tests see the state they expect."""
    tracing = tracemalloc.is_tracing()
    yield
    if not tracing and tracemalloc.is_tracing():
        tracemalloc.stop()


@pytest.fixture(autouse=True)
def _stores_up() -> Iterator[None]:
    """Every test starts with every store up: an outage a test provoked (a
    process-wide record, storage/store_health.py) does not make the next fail fast."""
    from gnn_faas.storage import store_health

    store_health.reset()
    yield
    store_health.reset()


S3_BUCKET = "gnn-faas-tests"
STORE_KINDS = ["file", "s3", "redis"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str]:
    with docker_engine() as host:
        yield host


@pytest.fixture(scope="session")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    boto3 = pytest.importorskip("boto3")
    # no AWS config or credentials of the machine may leak in (or out)
    isolated = tmp_path_factory.mktemp("aws")
    with moto_server() as endpoint, pytest.MonkeyPatch.context() as mp:
        for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION"):
            mp.delenv(var, raising=False)
        mp.setenv("AWS_CONFIG_FILE", str(isolated / "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(isolated / "credentials"))
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        mp.setenv("AWS_ACCESS_KEY_ID", "test")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "test")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        client = boto3.client("s3")
        client.create_bucket(Bucket=S3_BUCKET)
        client.close()
        yield f"s3://{S3_BUCKET}/tests"


def _clear(uri: str) -> None:
    """Delete what a test left in a shared server (keeps the servers' memory small)."""
    from gnn_faas.storage import store_health
    from gnn_faas.storage.backends import open_backend

    store_health.reset()  # an outage the test provoked is over: the server is up

    with open_backend(uri) as store:
        for key in store.ls(""):
            store.rm(key)


@pytest.fixture(params=STORE_KINDS)
def store_uri(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh, empty store URI of each kind: ``file://``, ``s3://`` or ``redis://``."""
    ns = f"t-{uuid.uuid4().hex[:12]}"
    if request.param == "file":
        yield f"file://{tmp_path / 'store'}"
        return
    if request.param == "s3":
        uri = f"{request.getfixturevalue('s3_env')}/{ns}"
    else:
        uri = f"{request.getfixturevalue('redis_url')}?prefix={ns}/"
    yield uri
    _clear(uri)


@pytest.fixture
def gpu_device() -> str:
    """The device ``gpu`` tests run on: ``cuda``, or what ``GNN_FAAS_GPU_CHECK_DEVICE`` names
    (``cpu`` stands in for it: scripts/gpu-check.sh proves its whole run so without a GPU)."""
    return os.environ.get("GNN_FAAS_GPU_CHECK_DEVICE") or "cuda"


def pytest_collection_modifyitems(config, items) -> None:
    """``@pytest.mark.gpu`` tests skip, saying why, where no CUDA device is visible (unless
    ``GNN_FAAS_GPU_CHECK_DEVICE`` names a stand-in)."""
    gpu_items = [i for i in items if i.get_closest_marker("gpu") is not None]
    if not gpu_items or os.environ.get("GNN_FAAS_GPU_CHECK_DEVICE", "cuda").startswith("cpu"):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False")
    for item in gpu_items:
        item.add_marker(skip)

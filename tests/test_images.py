"""The three container images, built by ``make images``.

Each image: OCI labels, a HEALTHCHECK, a non-root user; each container runs as
that user on a read-only root filesystem (only the /tmp tmpfs writable) and
answers readiness on ``/v2/health/ready`` and OpenFaaS's ``/_/health`` on
``$PORT``. The memory image holds no torch; no image holds the build's CA
bundle. The gateway container drives the docker platform through the engine's
socket: the whole bundle as containers answers as PyG does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from gnn_faas.ports import free_port
from gnn_faas.storage.datasets import ensure_dataset
from tests.docker_engine import readable_dir

pytestmark = pytest.mark.slow
KINDS = ("memory", "compute", "gateway")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


@pytest.fixture(scope="module")
def client(docker_host):
    import docker

    c = docker.DockerClient(base_url=docker_host, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def assets(docker_host):
    """A store with Bitcoin OTC and a checkpoint for it, readable by uid 10001."""
    import torch

    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model, csr_edge_index

    root = readable_dir("gnn-faas-images-")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(
        arch="gcn", in_dim=graph.manifest.feature_dim, hidden_dim=16, out_dim=2,
        num_layers=2, num_classes=2, graph="bitcoin-otc",
    )  # fmt: skip
    model = build_model(cfg, seed=3).eval()
    save_checkpoint(root / "ckpt", cfg, model.state_dict())
    ei = csr_edge_index(graph.read_blob("indptr"), graph.read_blob("indices"))
    x = torch.from_numpy(np.array(graph.read_blob("features"), dtype=np.float32))
    with torch.no_grad():
        reference = model(x, ei).numpy()
    yield {"root": root, "store": store, "ckpt": str(root / "ckpt"), "reference": reference}
    shutil.rmtree(root, ignore_errors=True)


def run(client, image: str, command: list[str], **kw):
    return client.containers.run(
        image,
        command,
        detach=True,
        network_mode="host",
        read_only=True,
        tmpfs={"/tmp": "rw,size=64m,mode=1777"},
        mem_limit="1g",
        **kw,
    )


def wait_ready(container, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        container.reload()
        if container.status in ("exited", "dead"):
            raise AssertionError(container.logs().decode(errors="replace")[-3000:])
        try:
            if requests.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready: {container.logs().decode(errors='replace')[-3000:]}")


@pytest.mark.parametrize("kind", KINDS)
def test_image_metadata(client, kind):
    attrs = client.images.get(f"gnn-faas-{kind}:latest").attrs
    cfg = attrs["Config"]
    assert cfg["User"] == "10001:10001"
    labels = cfg["Labels"]
    assert labels["org.opencontainers.image.title"] == f"gnn-faas-{kind}"
    for key in ("version", "revision", "created", "source", "description", "licenses"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert "/v2/health/ready" in " ".join(cfg["Healthcheck"]["Test"])
    assert "8080/tcp" in cfg["ExposedPorts"]
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PORT"] == "8080" and env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp"
    if kind == "memory":
        # A memory image without torch stays small: torch's CPU wheel alone would
        # add ~700 MB (the build also refuses an image where torch can be found).
        # The rest (Debian base, python, numpy, scipy, the storage clients) is
        # ~300 MB and moves with the versions pip resolves at build time.
        assert attrs["Size"] < 350e6


# what each image may and may not import
IMPORTS = {
    "memory": "import importlib.util as u; assert u.find_spec('torch') is None; "
    "import gnn_faas.functions.memory_app",
    "compute": "import torch, gnn_faas.functions.compute_app; assert torch.__version__",
    "gateway": "import importlib.util as u; assert u.find_spec('torch') is None; "
    "import docker, kubernetes, gnn_faas.gateway.app, gnn_faas.scheduler.platform.knative, "
    "gnn_faas.scheduler.platform.openfaas",
}


@pytest.mark.parametrize("kind", KINDS)
def test_image_imports_and_holds_no_ca_bundle_or_secret(client, kind):
    script = (
        IMPORTS[kind] + "\nimport hashlib, json, os\nfound = {}\n"
        "for top in ('/etc', '/opt', '/usr/lib', '/usr/share', '/usr/local', '/run', '/root'):\n"
        "    for d, _, fs in os.walk(top):\n"
        "        for f in fs:\n"
        "            p = os.path.join(d, f)\n"
        "            if f.endswith(('.crt', '.pem')) or 'secret' in d:\n"
        "                try: found[p] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
        "                except OSError: pass\n"
        "print(json.dumps(found))\n"
    )
    out = client.containers.run(
        f"gnn-faas-{kind}:latest",
        ["-c", script],
        entrypoint=["python"],
        remove=True,
        network_mode="host",
        read_only=True,
        tmpfs={"/tmp": ""},
    )
    found = json.loads(out.decode().strip().splitlines()[-1])
    # Debian's public CA store and certifi's may be there (as in python:3.11-slim); the
    # bundle the build got as a secret (the host's, which may hold a private CA) may not
    assert not [p for p in found if p.startswith("/run/secrets")], found
    if HOST_CA.is_file():
        host = hashlib.sha256(HOST_CA.read_bytes()).hexdigest()
        assert host not in found.values(), "the host's CA bundle is in the image"
    history = " ".join(h.get("CreatedBy", "") for h in client.api.history(f"gnn-faas-{kind}"))
    assert "BEGIN CERTIFICATE" not in history


def function_command(kind: str, assets: dict) -> tuple[list[str], list[str]]:
    """The container's arguments and what it mounts."""
    if kind == "memory":
        path = assets["store"][len("file://") :]
        return ["--store", assets["store"], "--graph", "bitcoin-otc"], [path]
    return ["--model", assets["ckpt"]], [assets["ckpt"]]


@pytest.mark.parametrize("kind", ["memory", "compute"])
def test_function_container_contract(client, assets, kind):
    import docker

    port = free_port()
    command, paths = function_command(kind, assets)
    c = run(
        client,
        f"gnn-faas-{kind}:latest",
        command,
        environment={"PORT": str(port), "HOST": "127.0.0.1"},
        mounts=[docker.types.Mount(p, p, type="bind", read_only=True) for p in paths],
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(c, url)
        for path in ("/v2/health/ready", "/_/health", "/v2/health/live"):
            assert requests.get(f"{url}{path}", timeout=5).status_code == 200, path
        code, out = c.exec_run(["id", "-u"])
        assert code == 0 and out.decode().strip() == "10001"
        code, out = c.exec_run(["sh", "-c", "touch /opt/x || touch /x"])
        assert code != 0 and b"Read-only file system" in out
        code, _ = c.exec_run(["sh", "-c", "touch /tmp/x"])
        assert code == 0
        c.reload()
        assert c.attrs["HostConfig"]["ReadonlyRootfs"] is True
        # a SIGTERM stops it cleanly and quickly
        c.stop(timeout=20)
        c.reload()
        assert c.attrs["State"]["ExitCode"] == 0, c.logs()[-2000:]
    finally:
        c.remove(force=True)


def test_gateway_container_runs_the_bundle_as_containers(client, assets, docker_host):
    """The gateway image with the engine's socket: its functions are sibling
    containers; the bundle answers as PyG does; stopping it removes them."""
    import docker

    from gnn_faas.client import vertex_request

    sock = docker_host[len("unix://") :]
    port = free_port()
    cfg_dir = assets["root"] / "gateway-config"
    cfg_dir.mkdir(exist_ok=True)
    cfg_dir.chmod(0o755)
    config = {
        "store": assets["store"],
        "platform": {"kind": "docker", "memory_function_mb": 256, "compute_function_mb": 768},
        "models": [
            {"name": "btc", "graph": "bitcoin-otc", "dataset": None, "checkpoint": assets["ckpt"]}
        ],
    }
    (cfg_dir / "config.yaml").write_text(yaml.safe_dump(config))
    (cfg_dir / "config.yaml").chmod(0o644)
    paths = [assets["store"][len("file://") :], assets["ckpt"], str(cfg_dir)]
    mounts = [docker.types.Mount(p, p, type="bind", read_only=True) for p in paths]
    mounts.append(docker.types.Mount("/var/run/docker.sock", sock, type="bind"))
    c = run(
        client,
        "gnn-faas-gateway:latest",
        [],
        environment={
            "PORT": str(port),
            "HOST": "127.0.0.1",
            "GNN_FAAS_CONFIG": str(cfg_dir / "config.yaml"),
            "DOCKER_HOST": "unix:///var/run/docker.sock",
        },
        mounts=mounts,
        group_add=[str(os.stat(sock).st_gid)],
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(c, url, timeout=180)
        assert requests.get(f"{url}/_/health", timeout=5).status_code == 200
        fns = client.containers.list(ignore_removed=True, filters={"label": "io.gnn-faas.function"})
        mine = [f for f in fns if f.labels["io.gnn-faas.function"].startswith("btc-")]
        assert sorted(f.labels["io.gnn-faas.kind"] for f in mine) == ["compute", "memory"]
        r = requests.post(f"{url}/v2/models/btc/infer", json=vertex_request([1, 2, 3]), timeout=60)
        assert r.status_code == 200, r.text
        scores = np.asarray(r.json()["outputs"][0]["data"]).reshape(3, -1)
        np.testing.assert_allclose(scores, assets["reference"][[1, 2, 3]], 1e-4, 1e-5)
        code, out = c.exec_run(["id", "-u"])
        assert out.decode().strip() == "10001"
        c.stop(timeout=30)
        ids = {f.id for f in mine}
        left = {
            f.id
            for f in client.containers.list(
                ignore_removed=True, all=True, filters={"label": "io.gnn-faas.function"}
            )
        }
        assert not ids & left, "the gateway's function containers outlived it"
    finally:
        c.remove(force=True)


def test_functions_start_from_the_environment_alone(client, assets):
    """As the chart's OpenFaaS Functions run them (no command can be set): the
    store URI from a Secret's file (GNN_FAAS_STORE_FILE), the compute function's
    checkpoint pulled from the store at start (GNN_FAAS_MODEL_NAME), the memory
    function's cache from GNN_FAAS_CACHE_MAX_ROWS."""
    import docker

    from gnn_faas.functions.checkpoint_store import push_checkpoint

    push_checkpoint(assets["store"], assets["ckpt"], "btc")
    secrets = assets["root"] / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "url").write_text(assets["store"])
    (secrets / "url").chmod(0o644)
    store_path = assets["store"][len("file://") :]
    mounts = [docker.types.Mount(store_path, store_path, type="bind", read_only=True),
              docker.types.Mount("/var/openfaas/secrets", str(secrets), type="bind", read_only=True)]  # fmt: skip
    env = {"HOST": "127.0.0.1", "GNN_FAAS_STORE_FILE": "/var/openfaas/secrets/url"}
    started = []
    try:
        for kind, extra in (
            ("memory", {"GNN_FAAS_GRAPH": "bitcoin-otc", "GNN_FAAS_CACHE_MAX_ROWS": "0"}),
            ("compute", {"MODEL_DIR": "/tmp/model", "GNN_FAAS_MODEL_NAME": "btc"}),
        ):
            port = free_port()
            c = run(client, f"gnn-faas-{kind}:latest", [], mounts=mounts,
                    environment={**env, **extra, "PORT": str(port)})  # fmt: skip
            started.append(c)
            wait_ready(c, f"http://127.0.0.1:{port}")
            if kind == "compute":
                code, out = c.exec_run(["ls", "/tmp/model"])
                assert code == 0 and b"config.json" in out
            else:
                stats = requests.get(f"http://127.0.0.1:{port}/v1/stats", timeout=5).json()
                assert stats["cache"]["capacity_rows"] == 0  # request_centric: no cache
    finally:
        for c in started:
            c.remove(force=True)

"""End to end on the docker platform: ``gnn-faas up --platform docker`` with the
function instances as containers.

- the answers equal the PyG reference for the same checkpoint, as on the local
  platform (tests/gateway/test_gateway_e2e.py);
- a memory container killed mid-stream loses no request, and ``/metrics``
  counts the failure by reason;
- the memory-aware cache under a real cgroup limit: a memory container whose
  limit is tight for the stream serves it without an OOM kill because its
  cache shrinks to fit; told the machine's memory instead (memory awareness
  off), the same stream gets it OOM-killed, and the gateway still answers every
  request by retrying on a fresh container.
"""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from gnn_faas.client import vertex_request
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.ingest import build_csr, write_csr
from tests.docker_engine import readable_dir
from tests.gateway.test_gateway_e2e import burst, infer, output
from tests.pyg_reference import GCN, checkpoint_with_reference

pytestmark = pytest.mark.slow
RTOL, ATOL = 1e-4, 1e-5
MODEL = "btc"


def failures(url: str) -> dict[tuple[str, str], float]:
    """``gnn_faas_instance_failures_total`` by (function, reason) from /metrics."""
    out = {}
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("gnn_faas_instance_failures_total{"):
            labels, value = line[len("gnn_faas_instance_failures_total{") :].split("} ")
            kv = dict(part.split("=", 1) for part in labels.split(","))
            out[(kv["function"].strip('"'), kv["reason"].strip('"'))] = float(value)
    return out


def memory_containers(client, function: str):
    return client.containers.list(
        ignore_removed=True, filters={"label": f"io.gnn-faas.function={function}"}
    )


@pytest.fixture(scope="module")
def served(docker_host):
    root = readable_dir("gnn-faas-docker-e2e-")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    reference = checkpoint_with_reference(graph, root / "ckpt", seed=7, **GCN)
    config = {
        "store": store,
        # answers and crash recovery under bursts, not overload (as test_gateway_e2e.py)
        "gateway": {"admission": False},
        "platform": {
            "kind": "docker",
            "memory_function_mb": 256,
            "compute_function_mb": 768,
            "max_memory_instances": 2,
            "max_compute_instances": 2,
        },
        "models": [
            {
                "name": MODEL,
                "graph": "bitcoin-otc",
                "dataset": "bitcoin-otc",
                "checkpoint": str(root / "ckpt"),
                "max_targets": 64,
            }
        ],
    }
    try:
        with Stack(config, ready_timeout_s=180) as stack:
            yield stack, reference, graph
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_burst_through_containers_equals_pyg(served):
    stack, reference, graph = served
    status = stack.status()
    kinds = sorted(i["spec"]["kind"] for i in status["instances"])
    assert kinds == ["compute", "memory"]
    order = graph.read_blob("request_order")
    batches = [order[i : i + 2].tolist() for i in range(0, 40, 2)]
    for targets, resp in zip(batches, burst(stack.url, batches)):
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(output(resp, "scores"), reference[targets], RTOL, ATOL)
    # the cache of the memory container is sized from its cgroup limit
    cache = stack.status()["models"][0]["caches"][0]
    assert cache["rows"] > 0
    assert requests.get(f"{stack.url}/_/health", timeout=10).status_code == 200


def test_a_memory_container_killed_mid_stream_loses_no_request(served):
    import docker

    stack, reference, graph = served
    client = docker.from_env()
    order = graph.read_blob("request_order")
    batches = [order[i : i + 3].tolist() for i in range(200, 200 + 3 * 40, 3)]
    killed = []

    def kill_soon():
        time.sleep(0.3)
        for c in memory_containers(client, f"{MODEL}-memory"):
            c.kill()
            killed.append(c.id)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(pool.map(lambda t: infer(stack.url, vertex_request(t)), batches))
    killer.join()
    client.close()
    assert killed
    for targets, resp in zip(batches, responses):
        assert resp.status_code == 200, resp.text
        np.testing.assert_allclose(output(resp, "scores"), reference[targets], RTOL, ATOL)
    deadline = time.monotonic() + 60  # the health sweep sees the exit within a second or two
    counted = 0
    while not counted and time.monotonic() < deadline:
        counted = failures(stack.url).get((f"{MODEL}-memory", "exit_137"), 0)
        time.sleep(0.1)
    assert counted >= 1


# -- the memory-aware cache under a real limit -------------------------------------------
# A synthetic graph whose features (120k x 256 float32 = 117 MiB) are far more than a
# 192 MiB memory container can cache beside its runtime: a stream over all vertices fills
# any cache that does not watch the limit.
N, DIM, DEGREE, LIMIT_MB = 120_000, 256, 4, 192


@pytest.fixture(scope="module")
def big_graph(docker_host):
    root = readable_dir("gnn-faas-docker-oom-")
    store = f"file://{root / 'store'}"
    rng = np.random.default_rng(0)
    src = rng.integers(0, N, N * DEGREE, dtype=np.int64)
    dst = rng.integers(0, N, N * DEGREE, dtype=np.int64)
    csr = build_csr(src, dst, num_nodes=N, symmetrize=True, dedupe=True, drop_self_loops=True)
    feats = rng.standard_normal((csr.num_nodes, DIM), dtype=np.float32)
    write_csr(store, "synthetic", csr, feats)
    graph = open_graph(store, "synthetic")
    reference = checkpoint_with_reference(
        graph, root / "ckpt", seed=7, arch="gcn", hidden_dim=16, out_dim=2, num_layers=1,
        num_classes=2,
    )  # fmt: skip
    yield store, root / "ckpt", reference
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("aware", [True, False], ids=["memory-aware", "unaware"])
def test_memory_aware_cache_under_a_real_limit(big_graph, aware):
    store, ckpt, reference = big_graph
    config = {
        "store": store,
        "gateway": {"admission": False},  # every request must be answered, by retries if need be
        "platform": {
            "kind": "docker",
            "memory_function_mb": LIMIT_MB,
            "compute_function_mb": 768,
            "max_memory_instances": 2,
            "max_compute_instances": 1,
            "docker": {"memory_aware_cache": aware},
        },
        "buffers": {"num_buffers": 1},
        "models": [
            {
                "name": "syn",
                "graph": "synthetic",
                "dataset": None,
                "checkpoint": str(ckpt),
                "max_targets": 512,
                "mode": "no_sharing",
            }
        ],
    }
    # 200 requests of 400 vertices each: every vertex of the graph, with its neighbours
    order = np.random.default_rng(1).permutation(N)
    batches = [order[i : i + 400].tolist() for i in range(0, 200 * 400, 400)]
    with Stack(config, ready_timeout_s=180) as stack:
        for targets in batches:
            resp = infer(stack.url, vertex_request(targets), model="syn", timeout=120)
            assert resp.status_code == 200, resp.text
            np.testing.assert_allclose(output(resp, "scores"), reference[targets], RTOL, ATOL)
        ooms = failures(stack.url).get(("syn-memory", "oom"), 0)
        status = stack.status()
    pool = status["models"][0]["memory_pool"]["stats"]
    if aware:
        assert ooms == 0, status["instances"]
        cache = status["models"][0]["caches"][0]
        # the cache filled what the limit allows and then evicted rather than grow
        assert cache["evictions"] > 0
        assert cache["rows"] * DIM * 4 < LIMIT_MB * 2**20
    else:
        assert ooms >= 1, (status["instances"], pool)
        assert pool["retries"] >= 1 and pool["launches"] >= 2


# -- crash safety (docker platform) --------------------------------------------------------
@pytest.mark.parametrize("victim", ["gnn-faas up", "gateway worker"])
def test_function_containers_do_not_outlive_a_killed_gateway(served, victim):
    """SIGKILL of ``gnn-faas up`` (the gunicorn master): its worker sees the parent
    gone and stops its containers. SIGKILL of the worker (nothing of it runs any
    more): the master starts a new worker, whose platform removes the containers
    labelled by the dead one before it launches its own."""
    import contextlib
    import signal

    import docker
    import psutil

    stack0, _, _ = served
    config = {**stack0.config, "models": [{**stack0.config["models"][0], "name": "crash"}]}
    client = docker.from_env()

    def containers():
        return {
            c.id: c
            for c in client.containers.list(
                ignore_removed=True, all=True, filters={"label": "io.gnn-faas.function"}
            )
            if c.labels["io.gnn-faas.function"].startswith("crash-")
        }

    try:
        with Stack(config, ready_timeout_s=180) as stack:
            before = containers()
            assert len(before) == 2
            owner = {c.labels["io.gnn-faas.owner-pid"] for c in before.values()}
            worker = psutil.Process(int(owner.pop()))
            assert worker.ppid() == stack.proc.pid
            if victim == "gnn-faas up":
                stack.proc.send_signal(signal.SIGKILL)
                stack.proc.wait(timeout=10)
                deadline = time.monotonic() + 60
                while containers() and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert not containers(), "containers outlived the killed gateway"
                with contextlib.suppress(psutil.NoSuchProcess):
                    worker.wait(timeout=30)  # it exits once its shutdown is done
            else:
                worker.send_signal(signal.SIGKILL)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    now = containers()
                    if now and not set(now) & set(before) and len(now) == 2:
                        break
                    time.sleep(0.5)
                now = containers()
                assert not set(now) & set(before), "the dead worker's containers were not reaped"
                assert len(now) == 2
                r = infer(stack.url, vertex_request([5]), model="crash")
                assert r.status_code == 200, r.text
    finally:
        for c in containers().values():  # whatever a failed assertion left
            c.remove(force=True)
        client.close()


# -- bad input: functions that cannot start ----------------------------------------------
@pytest.mark.parametrize(
    ("images", "cause"),
    [
        ({"memory_image": "gnn-faas-memory:missing"}, "gnn-faas-memory:missing not found"),
        # the wrong function's image: the container starts, rejects its arguments, exits
        ({"memory_image": "gnn-faas-compute:latest"}, "did not become ready"),
        # an image with nothing to run: the engine cannot start the container
        ({"memory_image": "gnn-faas-base:bookworm"}, "cannot start"),
    ],
    ids=["missing-image", "never-ready", "cannot-start"],
)
def test_the_gateway_answers_503_with_the_cause_and_keeps_serving(served, images, cause):
    from gnn_faas.config import ServingConfig, from_dict
    from gnn_faas.gateway.app import create_gateway_app
    from gnn_faas.gateway.data_plane import DataPlane

    stack0, _, _ = served
    raw = {**stack0.config, "platform": {**stack0.config["platform"], "min_instances": 0}}
    raw["platform"]["docker"] = {**images, "start_timeout_s": 20}
    plane = DataPlane(from_dict(ServingConfig, raw))
    plane.start()
    try:
        http = create_gateway_app(plane).test_client()
        r = http.post(f"/v2/models/{MODEL}/infer", json=vertex_request([1, 2]))
        assert r.status_code == 503 and cause in r.get_json()["error"], r.get_json()
        # still serving: health, metadata, metrics (with the failures by reason), more requests
        assert http.get("/v2/health/live").status_code == 200
        assert http.get(f"/v2/models/{MODEL}").status_code == 200
        metrics = http.get("/metrics").get_data(as_text=True)
        assert f'gnn_faas_instance_failures_total{{function="{MODEL}-memory"' in metrics
        r = http.post(f"/v2/models/{MODEL}/infer", json=vertex_request([3]))
        assert r.status_code == 503 and cause in r.get_json()["error"]
    finally:
        plane.shutdown()

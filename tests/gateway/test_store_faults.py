"""Serving from the stores a cluster uses, and what a store fault does to it.

``gnn-faas up`` stacks on S3 (moto) and Redis (redis-server) answer as PyG does
on the same graph. Behind a paused proxy (the store hangs, as when its process
is stopped) the gateway stays alive, answers each request within its deadline
(200 from what it holds, or 503 naming the store with ``Retry-After``) and
serves again when the store returns. A corrupt store is refused at start with
one line, and corruption found while serving takes the model out of service
(503), never a wrong answer, until the store verifies again
(docs/architecture.md, section 6).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import yaml

from gnn_faas.bench.store_proxy import StoreProxy, proxied, store_target
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.traces.replay import vertex_request
from tests.pyg_reference import GCN, checkpoint_with_reference

pytestmark = pytest.mark.slow
RTOL, ATOL = 1e-4, 1e-5
MODEL = "btc"
TIMEOUT_S = 3.0  # the stacks' request_timeout_s


def stack_config(store: str, ckpt, **gateway) -> dict:
    return {
        "store": store,
        "gateway": {"admission": False, "request_timeout_s": TIMEOUT_S, "threads": 4, **gateway},
        "platform": {
            "memory_function_mb": 256,
            "compute_function_mb": 512,
            "max_memory_instances": 1,
            "max_compute_instances": 1,
        },
        "models": [{
            "name": MODEL, "graph": "bitcoin-otc", "dataset": "bitcoin-otc",
            "checkpoint": str(ckpt), "max_targets": 64, "mode": "no_sharing",
        }],
    }  # fmt: skip


def infer(url: str, targets, timeout: float = 60.0) -> requests.Response:
    return requests.post(
        f"{url}/v2/models/{MODEL}/infer", json=vertex_request(list(targets)), timeout=timeout
    )


def scores(resp: requests.Response) -> np.ndarray:
    out = {o["name"]: o for o in resp.json()["outputs"]}["scores"]
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


@pytest.fixture(scope="module")
def remote(request, tmp_path_factory):
    """``(store uri, reference, graph)`` on S3 or Redis, Bitcoin OTC prepared."""
    kind = request.param
    root = tmp_path_factory.mktemp(f"store-{kind}")
    if kind == "s3":
        uri = f"{request.getfixturevalue('s3_env')}/faults"
    else:
        uri = f"{request.getfixturevalue('redis_url')}?prefix=faults/"
    graph = ensure_dataset(uri, "bitcoin-otc")
    reference = checkpoint_with_reference(graph, root / "ckpt", seed=5, **GCN)
    return uri, reference, graph, root / "ckpt"


@pytest.mark.parametrize("remote", ["s3", "redis"], indirect=True)
def test_answers_on_a_remote_store_equal_pyg(remote):
    uri, reference, graph, ckpt = remote
    order = graph.read_blob("request_order")
    batches = [order[i : i + 3].tolist() for i in range(0, 60, 3)]
    with Stack(stack_config(uri, ckpt), ready_timeout_s=120) as stack:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda t: infer(stack.url, t), batches))
        for targets, r in zip(batches, answers):
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(scores(r), reference[targets], RTOL, ATOL)


@pytest.mark.parametrize("remote", ["redis"], indirect=True)
def test_a_hung_store_is_a_named_503_within_the_deadline_and_never_an_outage(remote):
    uri, reference, graph, ckpt = remote
    with StoreProxy(store_target(uri)) as proxy:
        via, env = proxied(uri, proxy.port)
        # a structure budget below the structure's size: k-hop reads go to the store
        config = stack_config(via, ckpt, structure_budget_mb=0.07)
        with Stack(config, ready_timeout_s=120, env=env) as stack:
            assert infer(stack.url, [1, 2]).status_code == 200
            proxy.pause()
            targets = [[int(t)] for t in np.linspace(0, graph.num_nodes - 1, 12).astype(int)]
            with ThreadPoolExecutor(12) as pool:
                pending = [pool.submit(infer, stack.url, t, 2 * TIMEOUT_S + 5) for t in targets]
                # every gateway thread may now wait on the store: liveness does not
                live = [requests.get(f"{stack.url}/v2/health/live", timeout=5) for _ in range(3)]
                answers = [f.result() for f in pending]
            assert all(r.status_code == 200 for r in live)
            codes = [r.status_code for r in answers]
            assert set(codes) <= {200, 503} and 503 in codes, codes
            for t, r in zip(targets, answers):
                if r.status_code == 200:  # served from what the gateway held: exact
                    np.testing.assert_allclose(scores(r), reference[t], RTOL, ATOL)
                else:
                    assert "graph store" in r.json()["error"], r.text
                    assert int(r.headers["Retry-After"]) >= 1
            # ready stays: the outage is answered per request, the pod keeps its Service
            assert requests.get(f"{stack.url}/v2/health/ready", timeout=5).status_code == 200
            metrics = requests.get(f"{stack.url}/metrics", timeout=5).text
            assert "gnn_faas_store_up" in metrics
            proxy.resume()
            for _ in range(200):  # back in service once a probe gets through (polled)
                r = infer(stack.url, targets[-1][:1])
                if r.status_code == 200:
                    break
                time.sleep(0.1)
            assert r.status_code == 200
            np.testing.assert_allclose(scores(r), reference[targets[-1]], RTOL, ATOL)


def up_process(config: dict, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run(
        [sys.executable, "-m", "gnn_faas", "up", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("blob", "how"),
    [("indices", "flip"), ("features", "flip"), ("indptr", "truncate"), ("degree", "remove"),
     ("manifest", "garble")],
)  # fmt: skip
def test_a_corrupt_store_is_refused_at_start_with_one_line(tmp_path, blob, how):
    root = tmp_path / "store"
    graph = ensure_dataset(f"file://{root}", "bitcoin-otc")
    checkpoint_with_reference(graph, tmp_path / "ckpt", seed=1, **GCN)
    name = "manifest.json" if blob == "manifest" else graph.info(blob).file
    path = root / "bitcoin-otc" / name
    raw = bytearray(path.read_bytes())
    if how == "flip":
        raw[len(raw) // 2] ^= 0x04
        path.write_bytes(bytes(raw))
    elif how == "truncate":
        path.write_bytes(bytes(raw[:-8]))
    elif how == "remove":
        path.unlink()
    else:
        path.write_text(json.dumps({"format": "gnn-faas-graph", "version": 1}))
    done = up_process(stack_config(f"file://{root}", tmp_path / "ckpt"), tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "bitcoin-otc" in errors[0] and (name in errors[0] or "manifest" in errors[0])


def test_corruption_found_while_serving_takes_the_model_out_of_service(tmp_path):
    root = tmp_path / "store"
    graph = ensure_dataset(f"file://{root}", "bitcoin-otc")
    reference = checkpoint_with_reference(graph, tmp_path / "ckpt", seed=2, **GCN)
    indices = root / "bitcoin-otc" / "indices.bin"
    good = indices.read_bytes()
    config = stack_config(f"file://{root}", tmp_path / "ckpt", structure_budget_mb=0.07)
    with Stack(config, ready_timeout_s=120) as stack:
        assert infer(stack.url, [0]).status_code == 200
        bad = bytearray(good)
        bad[: len(bad) // 2] = bytes(len(bad) // 2)  # zeroed, same size
        indices.write_bytes(bytes(bad))
        codes = []
        for t in np.linspace(0, graph.num_nodes - 1, 30).astype(int):
            r = infer(stack.url, [int(t)])
            codes.append(r.status_code)
            if r.status_code == 200:  # read before the corrupt chunk was met: exact
                np.testing.assert_allclose(scores(r), reference[[int(t)]], RTOL, ATOL)
            else:
                assert r.status_code == 503 and "out of service" in r.json()["error"], r.text
        assert 503 in codes
        # once out, every request is 503 and the gateway says it is not ready
        assert infer(stack.url, [0]).status_code == 503
        assert requests.get(f"{stack.url}/v2/health/ready", timeout=5).status_code == 503
        assert requests.get(f"{stack.url}/v2/health/live", timeout=5).status_code == 200

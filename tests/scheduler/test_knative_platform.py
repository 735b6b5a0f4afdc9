"""The knative backend against a real kube-apiserver, the test playing Knative.

The chart is installed for real; the test then does what Knative's
controllers would: it starts real function processes (``gnn-faas serve``
through the local platform), writes each Knative Service's status (URL of
the process, Ready, latest ready revision), creates the revision's pods and
sets them Ready through the status subresource, and creates the revision's
PodAutoscaler with a desired and actual scale. The gateway (``gnn-faas up``
with the chart's own serving ConfigMap, and the gateway ServiceAccount's
token) serves requests end to end through the backend; answers equal the
PyG reference; ``gnn-faas status`` shows the replicas the test set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import requests
import yaml

from gnn_faas.client import vertex_request
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.local import LocalPlatform
from gnn_faas.stack import Stack
from gnn_faas.storage.datasets import ensure_dataset
from tests.charts.test_chart_install import sa_kubeconfig
from tests.kube import CHART, Cluster, cluster
from tests.pyg_reference import GCN, checkpoint_with_reference

pytestmark = pytest.mark.slow
NS, RELEASE, MODEL = "kn-e2e", "e2e", "btc"
RTOL, ATOL = 1e-4, 1e-5


class FakeKnative:
    """What Knative's controllers would write, written by the test."""

    def __init__(self, c: Cluster):
        self.c = c

    def service_ready(self, ksvc: str, url: str, revision: str) -> None:
        status = {
            "status": {
                "url": url,
                "latestReadyRevisionName": revision,
                "latestCreatedRevisionName": revision,
                "observedGeneration": 1,
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "ConfigurationsReady", "status": "True"},
                    {"type": "RoutesReady", "status": "True"},
                ],
            }
        }
        self.patch_status("ksvc", ksvc, status)

    def patch_status(self, kind: str, name: str, body: dict) -> None:
        self.c.kubectl(
            "patch", kind, name, "-n", NS, "--subresource=status", "--type=merge",
            "-p", json.dumps(body),
        )  # fmt: skip

    def pod(self, name: str, revision: str, ready: bool) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": {"serving.knative.dev/revision": revision},
            },
            "spec": {
                # no controller-manager: no token controller to mount one
                "automountServiceAccountToken": False,
                "containers": [{"name": "user-container", "image": "gnn-faas-memory:0.1.0"}],
            },
        }
        self.c.kubectl("apply", "-f", "-", input=json.dumps(pod))
        self.pod_ready(name, ready)

    def pod_ready(self, name: str, ready: bool) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}
        self.patch_status("pod", name, {"status": {"phase": "Running", "conditions": [cond]}})

    def autoscaler(self, revision: str, desired: int, actual: int) -> None:
        pa = {
            "apiVersion": "autoscaling.internal.knative.dev/v1alpha1",
            "kind": "PodAutoscaler",
            "metadata": {"name": revision, "namespace": NS},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": revision},
                "protocolType": "http1",
            },
        }
        self.c.kubectl("apply", "-f", "-", input=json.dumps(pa))
        self.patch_status(
            "podautoscaler",
            revision,
            {
                "status": {
                    "desiredScale": desired,
                    "actualScale": actual,
                    "serviceName": revision,
                    "metricsServiceName": f"{revision}-private",
                }
            },
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("knative")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    ckpt = root / "ckpt"
    reference = checkpoint_with_reference(graph, ckpt, seed=3, **GCN)

    c = cluster()
    c.kubectl("create", "namespace", NS)
    c.kubectl("create", "serviceaccount", "default", "-n", NS)  # no controller makes it
    c.helm(
        "install", RELEASE, str(CHART), "-n", NS, "--set", f"models[0].name={MODEL}",
        "--set", "models[0].graph=bitcoin-otc", "--set", "functions.keepAliveSeconds=60",
    )  # fmt: skip
    knative = FakeKnative(c)
    functions = LocalPlatform(reaper_interval_s=None)
    memory = functions.launch(
        FunctionSpec(f"{MODEL}-memory", "memory", ("--store", store, "--graph", "bitcoin-otc"), 512)
    )
    compute = functions.launch(
        FunctionSpec(f"{MODEL}-compute", "compute", ("--model", str(ckpt)), 512)
    )
    figures = {"memory": (memory.url, 3, 2, 2), "compute": (compute.url, 1, 1, 1)}
    for kind, (url, desired, actual, ready) in figures.items():
        ksvc = f"{RELEASE}-gnn-faas-{MODEL}-{kind}"
        rev = f"{ksvc}-00001"
        knative.service_ready(ksvc, url, rev)
        knative.autoscaler(rev, desired, actual)
        for i in range(ready):
            knative.pod(f"{rev}-deployment-{i}", rev, ready=True)
        knative.pod(f"{rev}-deployment-pending", rev, ready=False)

    # the gateway runs the chart's own serving YAML, with this machine's paths
    cm = c.get_json("configmap", f"{RELEASE}-gnn-faas-gateway", "-n", NS)
    serving = yaml.safe_load(cm["data"]["serving.yaml"])
    assert serving["store"] == "${GNN_FAAS_STORE}"
    assert serving["platform"]["kind"] == "knative"
    serving["models"][0]["checkpoint"] = str(ckpt)
    serving["platform"]["knative"]["kubeconfig"] = sa_kubeconfig(
        c, root, NS, f"{RELEASE}-gnn-faas-gateway"
    )
    serving["platform"]["knative"]["start_timeout_s"] = 3.0
    serving["platform"]["knative"]["refresh_s"] = 0.2
    # answers through the backend, not overload: no shedding on a loaded test machine
    serving.setdefault("gateway", {})["admission"] = False
    mp = pytest.MonkeyPatch()
    mp.setenv("GNN_FAAS_STORE", store)
    try:
        with Stack(serving, ready_timeout_s=120) as s:
            yield s, reference, graph, knative
    finally:
        mp.undo()
        functions.shutdown()


def infer(url: str, targets) -> requests.Response:
    return requests.post(f"{url}/v2/models/{MODEL}/infer", json=vertex_request(targets), timeout=60)


def scores(resp) -> np.ndarray:
    o = next(o for o in resp.json()["outputs"] if o["name"] == "scores")
    return np.asarray(o["data"], dtype=np.float64).reshape(o["shape"])


def test_requests_through_knative_equal_pyg(stack):
    s, reference, graph, _ = stack
    order = graph.read_blob("request_order")
    batches = [order[i : i + 3].tolist() for i in range(0, 36, 3)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda t: infer(s.url, t), batches))
    for targets, r in zip(batches, responses):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(scores(r), reference[targets], RTOL, ATOL)
    st = s.status()
    rows = {r["function"]: r for r in st["models"][0]["functions"]}
    # dispatch slots never beyond ready replicas x containerConcurrency (2 x 1, 1 x 1)
    pools = st["models"][0]
    warm = [i for i in pools["memory_pool"]["instances"] if i["state"] != "launching"]
    assert 1 <= len(warm) <= 2
    assert len([i for i in pools["compute_pool"]["instances"] if i["state"] != "launching"]) == 1
    assert {i["url"] for i in warm} == {rows[f"{MODEL}-memory"]["url"]}
    metering = st["metering"]["by_function"]
    assert metering[f"{MODEL}-memory"]["instances"] == 3  # the observed pods, billed
    assert metering[f"{MODEL}-memory"]["busy_s"] > 0


def test_status_shows_the_replicas_the_test_set(stack):
    s, *_ = stack
    rows = {r["function"]: r for r in s.status()["models"][0]["functions"]}
    mem, comp = rows[f"{MODEL}-memory"], rows[f"{MODEL}-compute"]
    assert (mem["desired"], mem["actual"], mem["ready"]) == (3, 2, 2)
    assert (comp["desired"], comp["actual"], comp["ready"]) == (1, 1, 1)
    assert mem["revision"] == f"{RELEASE}-gnn-faas-{MODEL}-memory-00001"
    assert mem["error"] is None and mem["queue_length"] == 0 and mem["in_flight"] == 0
    out = subprocess.run(
        [sys.executable, "-m", "gnn_faas", "status", "--url", s.url],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    line = next(ln for ln in out.splitlines() if ln.strip().startswith(f"{MODEL}-memory "))
    assert line.split()[1:7] == [
        "3",
        "2",
        "2",
        "0",
        "0",
        f"{RELEASE}-gnn-faas-{MODEL}-memory-00001",
    ]
    # the memory replicas' caches are not read through the Service URL (a random
    # replica, and a call counted against its containerConcurrency)
    assert "caches: per-replica cache figures are on each memory replica's /metrics" in out
    metrics = requests.get(f"{s.url}/metrics", timeout=10).text
    assert f'gnn_faas_function_replicas{{function="{MODEL}-memory",kind="desired"}} 3.0' in metrics
    assert f'gnn_faas_function_replicas{{function="{MODEL}-memory",kind="ready"}} 2.0' in metrics
    assert f'gnn_faas_function_in_flight{{function="{MODEL}-compute"}} 0.0' in metrics


def test_a_replica_going_away_and_knative_scaling_up(stack):
    """Knative scales in (a pod stops being ready): its slots go, requests are
    still served; it scales out again: the new figures show in status."""
    s, reference, graph, knative = stack
    rev = f"{RELEASE}-gnn-faas-{MODEL}-memory-00001"
    knative.pod_ready(f"{rev}-deployment-1", False)
    knative.autoscaler(rev, 1, 1)
    memory = f"{MODEL}-memory"
    counts = lambda: (lambda r: (r["desired"], r["actual"], r["ready"]))(_row(s, memory))  # noqa: E731
    assert _wait(lambda: counts() == (1, 1, 1)), counts()  # read at the next refresh
    r = infer(s.url, [1, 2, 3])
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(scores(r), reference[[1, 2, 3]], RTOL, ATOL)
    knative.pod_ready(f"{rev}-deployment-1", True)
    knative.pod_ready(f"{rev}-deployment-pending", True)
    knative.autoscaler(rev, 3, 3)
    assert _wait(lambda: counts() == (3, 3, 3)), counts()


def _row(s, fn: str) -> dict:
    return next(r for r in s.status()["models"][0]["functions"] if r["function"] == fn)


def _wait(pred, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_a_forbidding_api_is_a_clear_error_and_serving_goes_on(stack):
    """The gateway's RoleBinding removed: status and log say the API forbids
    the read, requests are still answered on the slots the gateway holds; the
    binding restored, the error clears."""
    s, reference, _, knative = stack
    c = knative.c
    name = f"{RELEASE}-gnn-faas-gateway"
    binding = c.get_json("rolebinding", name, "-n", NS)
    for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        binding["metadata"].pop(key, None)
    c.kubectl("delete", "rolebinding", name, "-n", NS)
    try:
        fn = f"{MODEL}-memory"
        assert _wait(lambda: "(403)" in (_row(s, fn).get("error") or "")), _row(s, fn)
        assert "forbids the gateway's ServiceAccount to list" in _row(s, fn)["error"]
        r = infer(s.url, [4, 5])
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(scores(r), reference[[4, 5]], RTOL, ATOL)
        out = subprocess.run(
            [sys.executable, "-m", "gnn_faas", "status", "--url", s.url],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "platform error: the Kubernetes API forbids" in out
        assert "forbids" in s.log_tail(400)  # logged (error level) by the gateway
    finally:
        c.kubectl("apply", "-f", "-", input=json.dumps(binding))
    assert _wait(lambda: _row(s, f"{MODEL}-memory").get("error") is None)

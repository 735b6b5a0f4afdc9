"""The openfaas backend against an in-test OpenFaaS gateway.

The fake gateway implements the documented REST API (basic auth on
``/system/*``): list, read and deploy functions, ``/system/scale-function``
(replicas become available at once: the fake plays the operator) and
``/function/NAME[.NAMESPACE]/...`` proxied to a small echo function (a
namespace other than the one the functions live in is a 404, as OpenFaaS
answers). The backend is
driven by the gateway's real :class:`FunctionPool`, so scaling follows
FaaS-GNN's launch rule as the gateway applies it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests
from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from gnn_faas.clock import RealClock
from gnn_faas.config import OpenFaaSSettings
from gnn_faas.errors import NotFound, Unavailable
from gnn_faas.scheduler.function_pool import FunctionPool
from gnn_faas.scheduler.platform import open_platform
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.openfaas import OpenFaaSPlatform

USER, PASSWORD = "admin", "s3cret"
SELECTOR = "app.kubernetes.io/instance=test"


class FakeOpenFaaS:
    """State of the fake gateway: functions, scale calls, a fault switch."""

    def __init__(self):
        self.functions: dict[str, dict] = {}
        self.namespace = "openfaas-fn"  # where the functions live
        self.system_namespaces: set[str | None] = set()  # ?namespace= of /system calls
        self.scale_calls: list[tuple[str, int]] = []
        self.deployed: list[dict] = []
        self.fail_reads = False
        self.invocations = 0
        self.release = threading.Event()  # /function/*/slow waits for it
        self.release.set()
        self.lock = threading.Lock()

    def add(self, name: str, labels: dict, replicas: int = 0) -> None:
        self.functions[name] = {
            "name": name,
            "image": "gnn-faas-memory:0.1.0",
            "replicas": replicas,
            "availableReplicas": replicas,
            "labels": labels,
            "requests": {"memory": "256Mi", "cpu": "500m"},
        }

    def app(self) -> Flask:
        app = Flask("fake-openfaas")

        @app.before_request
        def auth():
            if request.path.startswith("/system/"):
                self.system_namespaces.add(request.args.get("namespace"))
                a = request.authorization
                if a is None or (a.username, a.password) != (USER, PASSWORD):
                    return "unauthorized", 401
            return None

        @app.get("/system/functions")
        def list_functions():
            return jsonify(list(self.functions.values()))

        @app.post("/system/functions")
        def deploy():
            body = request.get_json()
            self.deployed.append(body)
            self.add(body["service"], body.get("labels", {}), replicas=1)
            return "", 202

        @app.get("/system/function/<name>")
        def read(name):
            if self.fail_reads:
                return "provider error: etcd timeout", 500
            if name not in self.functions:
                return f"function {name} not found", 404
            return jsonify(self.functions[name])

        @app.post("/system/scale-function/<name>")
        def scale(name):
            if name not in self.functions:
                return "not found", 404
            n = int(request.get_json()["replicas"])
            with self.lock:
                self.scale_calls.append((name, n))
                self.functions[name]["replicas"] = n
                self.functions[name]["availableReplicas"] = n
            return "", 202

        @app.route("/function/<name>/<path:rest>", methods=["GET", "POST"])
        def invoke(name, rest):
            name, _, ns = name.partition(".")
            if ns and ns != self.namespace:
                return f"function {name}.{ns} not found", 404
            if name not in self.functions or not self.functions[name]["availableReplicas"]:
                return "no replicas", 502
            with self.lock:
                self.invocations += 1
            if rest == "slow":
                self.release.wait(10)
            return jsonify({"function": name, "path": rest, "body": request.get_data(as_text=True)})

        return app


@contextmanager
def serve(fake: FakeOpenFaaS) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, fake.app(), threaded=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        t.join(5)


@pytest.fixture
def fake() -> Iterator[tuple[FakeOpenFaaS, str]]:
    f = FakeOpenFaaS()
    with serve(f) as url:
        yield f, url


def spec(name: str = "m-memory") -> FunctionSpec:
    return FunctionSpec(name=name, kind="memory", args=(), memory_mb=256, vcpus=0.5)


def platform(url: str, monkeypatch, password: str = PASSWORD, **kw) -> OpenFaaSPlatform:
    monkeypatch.setenv("OPENFAAS_USER", USER)
    monkeypatch.setenv("OPENFAAS_PASSWORD", password)
    settings = OpenFaaSSettings(
        url=url, selector=SELECTOR, refresh_s=0.0, start_timeout_s=1.5, **kw
    )
    return open_platform("openfaas", settings=settings, reaper_interval_s=None)


LABELS = {"app.kubernetes.io/instance": "test", "gnn-faas.io/function": "m-memory"}


def test_deploy_then_invoke_through_function_route(fake, monkeypatch):
    f, url = fake
    p = platform(url, monkeypatch)
    name = p.deploy(spec(), "gnn-faas-memory:0.1.0", name="rel-m-memory")
    body = f.deployed[0]
    assert body["service"] == "rel-m-memory" and body["image"] == "gnn-faas-memory:0.1.0"
    assert body["limits"] == body["requests"] == {"memory": "256Mi", "cpu": "500m"}
    assert body["readOnlyRootFilesystem"] is True
    assert body["labels"]["gnn-faas.io/function"] == "m-memory"
    assert body["labels"]["app.kubernetes.io/instance"] == "test"
    inst = p.launch(spec())
    assert inst.url == f"{url}/function/{name}"
    with p.busy(inst.id):
        r = requests.post(f"{inst.url}/echo", data="hi", timeout=5).json()
    assert r == {"function": "rel-m-memory", "path": "echo", "body": "hi"}
    rep = p.replicas("m-memory")
    assert (rep["desired"], rep["actual"], rep["ready"], rep["error"]) == (1, 1, 1, None)
    report = p.metering()
    assert report.functions["m-memory"].instances == 1
    assert report.functions["m-memory"].busy_s > 0
    p.shutdown()


def test_finds_function_by_labels_only(fake, monkeypatch):
    f, url = fake
    f.add("other-release-m-memory", {**LABELS, "app.kubernetes.io/instance": "other"}, 1)
    p = platform(url, monkeypatch)
    with pytest.raises(Unavailable, match="no OpenFaaS function with labels"):
        p.launch(spec())
    f.add("test-m-memory", LABELS, 1)
    assert p.launch(spec()).url.endswith("/function/test-m-memory")


def test_gateway_scaling_follows_the_launch_rule(fake, monkeypatch):
    """Launch only when no slot is idle and n_req > n_instances: sequential
    calls reuse one replica; concurrent ones scale up one by one; slots
    released at keep-alive expiry scale it back to zero."""
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=0)
    p = platform(url, monkeypatch, gateway_scaling=True)
    pool = FunctionPool(
        "m-memory", launch=lambda: p.launch(spec()), clock=RealClock(), max_instances=3
    )

    def call(path):
        def run(inst):
            with p.busy(inst.id):
                return requests.post(f"{inst.url}/{path}", timeout=10).json()["path"]

        return run

    try:
        for _ in range(4):  # one at a time: one replica is enough
            assert pool.submit(call("fast")).result(10) == "fast"
        assert f.scale_calls == [("test-m-memory", 1)]
        f.release.clear()
        futures = [pool.submit(call("slow")) for _ in range(3)]
        deadline = time.monotonic() + 60  # polled; a loaded machine launches slowly
        while f.functions["test-m-memory"]["replicas"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        f.release.set()
        assert [fu.result(10) for fu in futures] == ["slow"] * 3
        ups = [n for _, n in f.scale_calls]
        # two launches (n_req 2 > 1, then 3 > 2) ask once or twice, never beyond 3
        assert ups[0] == 1 and ups[-1] == 3 and ups == sorted(set(ups)), ups
        assert f.invocations == 7
        # keep-alive expiry: the data plane removes idle instances and stops them
        for inst in pool.instances():
            assert pool.remove(inst)
            p.stop(inst.id)
        assert [n for _, n in f.scale_calls][-1] == 0
        assert f.functions["test-m-memory"]["replicas"] == 0
    finally:
        pool.close()
        p.shutdown()


def test_openfaas_autoscaler_owns_replicas_without_gateway_scaling(fake, monkeypatch):
    """Calls in flight are bounded by available replicas x concurrency."""
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=2)
    p = platform(url, monkeypatch, concurrency=2)
    slots = [p.launch(spec()) for _ in range(4)]
    assert len({s.id for s in slots}) == 4
    with pytest.raises(Unavailable, match=r"no free ready replica.*4 slots held, concurrency 2"):
        p.launch(spec())
    assert f.scale_calls == []
    # OpenFaaS scales in: the slots on the lost replica fail, the data plane drops them
    f.functions["test-m-memory"]["availableReplicas"] = 1
    states = sorted(i.state for i in p.instances("m-memory"))
    assert states == ["failed", "failed", "ready", "ready"]
    assert len(p.reap()) == 2
    p.shutdown()


def test_wrong_credentials_are_a_clear_error(fake, monkeypatch):
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=1)
    p = platform(url, monkeypatch, password="wrong")
    with pytest.raises(Unavailable, match=r"refused the credentials.*\(401\)"):
        p.launch(spec())
    assert "401" in p.replicas("m-memory")["error"]


def test_missing_function_is_a_clear_error(fake, monkeypatch):
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=1)
    p = platform(url, monkeypatch)
    p.launch(spec())
    del f.functions["test-m-memory"]
    with pytest.raises(NotFound, match="not found"):
        p.observe(spec())
    # the next read looks it up by its labels again, and says so
    assert "no OpenFaaS function with labels" in p.replicas("m-memory")["error"]


def test_server_error_keeps_serving_with_what_it_has(fake, monkeypatch, caplog):
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=1)
    p = platform(url, monkeypatch)
    inst = p.launch(spec())
    f.fail_reads = True
    rows = p.instances("m-memory")
    assert [i.state for i in rows] == ["ready"]  # the last view stands
    rep = p.replicas("m-memory")
    assert "500" in rep["error"] and "etcd timeout" in rep["error"]
    assert rep["ready"] == 1
    with p.busy(inst.id):
        assert requests.post(f"{inst.url}/echo", timeout=5).status_code == 200
    assert any("500" in r.getMessage() for r in caplog.records)
    f.fail_reads = False
    assert p.replicas("m-memory")["error"] is None
    p.shutdown()


def test_unreachable_gateway(monkeypatch):
    p = platform("http://127.0.0.1:9", monkeypatch)
    with pytest.raises(Unavailable, match="unreachable"):
        p.launch(spec())


def test_calls_carry_the_namespace(fake, monkeypatch):
    """Functions in a namespace of their own: /system calls name it and the
    invocation URL is /function/NAME.NAMESPACE (a bare name would go to
    OpenFaaS's default function namespace)."""
    f, url = fake
    f.namespace = "gnn"
    f.add("test-m-memory", LABELS, replicas=1)
    p = platform(url, monkeypatch, namespace="gnn")
    inst = p.launch(spec())
    assert inst.url == f"{url}/function/test-m-memory.gnn"
    with p.busy(inst.id):
        r = requests.post(f"{inst.url}/echo", data="x", timeout=5)
    assert r.status_code == 200 and r.json()["function"] == "test-m-memory"
    assert f.system_namespaces == {"gnn"}
    # the fake refuses another namespace, as OpenFaaS does: the check above could fail
    assert requests.post(f"{url}/function/test-m-memory.other/echo", timeout=5).status_code == 404
    p.shutdown()


def test_function_at_zero_is_woken_without_gateway_scaling(fake, monkeypatch):
    """minScale 0 and OpenFaaS's autoscaler in charge: nothing calls the
    function while it has no replica, so the backend asks for one."""
    f, url = fake
    f.add("test-m-memory", LABELS, replicas=0)
    p = platform(url, monkeypatch)
    inst = p.launch(spec())
    assert f.scale_calls == [("test-m-memory", 1)]
    with p.busy(inst.id):
        assert requests.post(f"{inst.url}/echo", timeout=5).status_code == 200
    # a function with replicas is left to OpenFaaS's autoscaler: a full one is not scaled
    with pytest.raises(Unavailable, match="no free ready replica"):
        p.launch(spec())
    assert f.scale_calls == [("test-m-memory", 1)]
    p.shutdown()


def test_concurrency_comes_from_the_functions_scale_target_label(fake, monkeypatch):
    f, url = fake
    f.add("test-m-memory", {**LABELS, "com.openfaas.scale.target": "3"}, replicas=1)
    p = platform(url, monkeypatch)  # settings say 1
    assert len({p.launch(spec()).id for _ in range(3)}) == 3
    with pytest.raises(Unavailable, match="concurrency 3"):
        p.launch(spec())
    p.shutdown()

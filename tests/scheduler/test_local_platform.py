"""The local platform with real processes: cold starts, keep-alive (scale to
zero), metering, crashes and clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.config import KnativeSettings
from gnn_faas.errors import InvalidRequest, NotFound, Unavailable
from gnn_faas.scheduler.platform import FunctionSpec, open_platform
from gnn_faas.scheduler.platform.local import LocalPlatform
from gnn_faas.scheduler.platform.openfaas import OpenFaaSPlatform
from gnn_faas.scheduler.platform.replica_slots import PlatformAPIError

# A throwaway instance: a Flask app with the OIP health routes that binds a free
# port and prints the same "listening on" line as `gnn-faas serve`.
HEALTH_SERVER = textwrap.dedent(
    """
    import argparse, os, sys, time
    from flask import Flask
    from werkzeug.serving import make_server

    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--fail", default=None)
    p.add_argument("--hang", action="store_true")
    a = p.parse_args()
    if a.fail:
        print(a.fail, file=sys.stderr)
        sys.exit(3)
    if a.hang:
        time.sleep(600)
    app = Flask("health")

    @app.get("/v2/health/ready")
    def ready():
        return {"ready": True}

    @app.get("/env")
    def env():
        return {k: os.environ.get(k) for k in ("GNN_FAAS_THREADS", "EXTRA")}

    server = make_server(a.host, 0, app, threaded=True)
    print(f"health listening on http://{a.host}:{server.server_port} (pid {os.getpid()})", flush=True)
    server.serve_forever()
    """
)


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("fn") / "health_server.py"
    path.write_text(HEALTH_SERVER)
    return str(path)


def factory(script):
    return lambda spec, host: [sys.executable, script, "--host", host, *spec.args]


def spec(name="fn", keep_alive_s=600.0, args=(), **kw) -> FunctionSpec:
    return FunctionSpec(name, "memory", tuple(args), 256, keep_alive_s=keep_alive_s, **kw)


def children() -> list[psutil.Process]:
    """This process's descendants, zombies included (none may be left)."""
    return psutil.Process().children(recursive=True)


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_launch_measures_cold_start_and_meters(script):
    before = {p.pid for p in children()}
    with LocalPlatform(command_factory=factory(script), reaper_interval_s=None) as platform:
        inst = platform.launch(spec(vcpus=1.5, env=(("EXTRA", "x"),)))
        assert inst.state == "ready" and inst.cold_start_s > 0
        assert get(f"{inst.url}/v2/health/ready") == {"ready": True}
        # vCPUs set the instance's threads; spec env reaches the process.
        assert get(f"{inst.url}/env") == {"GNN_FAAS_THREADS": "2", "EXTRA": "x"}
        assert [i.id for i in platform.instances("fn")] == [inst.id]
        assert platform.endpoints("fn") == [inst.url]
        with platform.busy(inst.id) as running:
            assert running.state == "busy"
            assert platform.instances()[0].state == "busy"
            time.sleep(0.05)
        assert platform.instances()[0].state == "ready"
        platform.stop(inst.id)
        assert platform.instances() == []
        assert not psutil.pid_exists(inst.pid)  # gone and reaped
        usage = platform.metering().instances[inst.id]
        assert usage.cold_starts == 1
        assert usage.cold_start_s_total == pytest.approx(inst.cold_start_s)
        assert usage.alive_s >= usage.busy_s > 0
        assert usage.allocated_gb_s == pytest.approx(256 / 1024 * usage.alive_s)
        assert usage.vcpu_s == pytest.approx(1.5 * usage.alive_s)
        with pytest.raises(NotFound), platform.busy(inst.id):
            pass
    assert {p.pid for p in children()} == before


@pytest.mark.slow
def test_keep_alive_reaps_idle_instances_deterministically(script):
    clock = FakeClock(0.0)
    with LocalPlatform(clock, command_factory=factory(script), reaper_interval_s=None) as platform:
        a = platform.launch(spec("a", keep_alive_s=10))
        b = platform.launch(spec("b", keep_alive_s=10))
        clock.advance(5)
        assert platform.reap() == []
        with platform.busy(a.id):
            clock.advance(20)  # b idles past its keep-alive; a is busy
            assert platform.reap() == [b.id]
            assert [i.id for i in platform.instances()] == [a.id]
        clock.advance(10)  # a was last used when its call ended: 10 s ago, not more
        assert platform.reap() == []
        clock.advance(1)
        assert platform.reap() == [a.id]
        assert platform.instances() == []
        report = platform.metering()
        # Alive time on the platform clock: exactly the fake seconds.
        assert report.instances[b.id].alive_s == pytest.approx(25)
        assert report.instances[a.id].alive_s == pytest.approx(36)
        assert report.instances[a.id].busy_s == pytest.approx(20)
        assert report.total.allocated_gb_s == pytest.approx(0.25 * (25 + 36))
        assert report.total.busy_gb_s == pytest.approx(0.25 * 20)
        assert report.total.cold_starts == 2


@pytest.mark.slow
def test_reaper_thread_scales_to_zero(script):
    before = {p.pid for p in children()}
    with LocalPlatform(command_factory=factory(script), reaper_interval_s=0.05) as platform:
        inst = platform.launch(spec(keep_alive_s=0.3))
        assert wait_for(lambda: platform.instances() == [])
        # out of the table first (no call can be routed to it), then terminated
        assert wait_for(lambda: inst.pid not in {p.pid for p in children()})
    assert {p.pid for p in children()} == before


@pytest.mark.slow
def test_crashed_instance_is_reported_failed(script):
    clock = FakeClock(0.0)
    with LocalPlatform(clock, command_factory=factory(script), reaper_interval_s=None) as platform:
        inst = platform.launch(spec())
        clock.advance(3)
        os.kill(inst.pid, signal.SIGKILL)
        assert wait_for(lambda: platform.instances()[0].state == "failed")
        clock.advance(7)  # no billing after the crash was noticed
        usage = platform.metering().instances[inst.id]
        assert usage.alive_s == pytest.approx(3)
        assert platform.endpoints() == []
        with pytest.raises(Unavailable), platform.busy(inst.id):
            pass
        assert platform.reap() == [inst.id]
        assert platform.instances() == []


@pytest.mark.slow
def test_failed_start_raises_with_log_tail(script):
    with LocalPlatform(
        command_factory=factory(script), reaper_interval_s=None, start_timeout_s=1.5
    ) as platform:
        with pytest.raises(Unavailable, match="no graph named nowhere"):
            platform.launch(spec(args=("--fail", "no graph named nowhere")))
        with pytest.raises(Unavailable, match="not ready after 1.5 s"):
            platform.launch(spec(args=("--hang",)))
        assert [i.state for i in platform.instances()] == ["failed", "failed"]
        assert all(not psutil.pid_exists(i.pid) for i in platform.instances())
        assert len(platform.reap()) == 2


@pytest.mark.slow
def test_real_memory_function(tmp_path):
    """`gnn-faas serve memory` (gunicorn master + worker) through the platform."""
    from gnn_faas.storage.datasets import ensure_dataset

    uri = f"file://{tmp_path}/store"
    ensure_dataset(uri, "bitcoin-otc")
    before = {p.pid for p in children()}
    platform = LocalPlatform(reaper_interval_s=None)
    mem = FunctionSpec("mem", "memory", ("--store", uri, "--graph", "bitcoin-otc"), 256)
    inst = platform.launch(mem)
    assert inst.cold_start_s > 0
    assert get(f"{inst.url}/v2/health/ready")["ready"] is True
    assert len(children()) >= len(before) + 2  # the master and its worker
    platform.shutdown()
    assert {p.pid for p in children()} == before  # no worker left behind
    assert platform.metering().total.cold_starts == 1
    with pytest.raises(Unavailable):
        platform.launch(mem)


def test_replica_figures_follow_the_instances(script):
    """On the local platform the gateway scales itself: desired = actual = live
    instances, ready = those that take work (gnn-faas status' function rows)."""
    with LocalPlatform(reaper_interval_s=None, command_factory=factory(script)) as p:
        a = p.launch(spec("f"))
        p.launch(spec("f"))
        p.launch(spec("g"))
        assert p.replicas("f") == {
            "function": "f", "desired": 2, "actual": 2, "ready": 2, "revision": None,
            "error": None,
        }  # fmt: skip
        p.stop(a.id)
        assert (p.replicas("f")["desired"], p.replicas("f")["ready"]) == (1, 1)
        assert p.replicas("none")["desired"] == 0


def test_open_platform_registry():
    # knative and openfaas are registered (tests/scheduler/test_knative_*.py, test_openfaas_*)
    with pytest.raises(PlatformAPIError, match="no Kubernetes configuration"):
        open_platform("knative", settings=KnativeSettings(kubeconfig="/nonexistent/kubeconfig"))
    with open_platform("openfaas") as platform:
        assert isinstance(platform, OpenFaaSPlatform) and platform.instances() == []
    with pytest.raises(InvalidRequest, match="unknown platform"):
        open_platform("lambda")
    with open_platform("local", reaper_interval_s=None) as platform:
        assert isinstance(platform, LocalPlatform) and platform.instances() == []


def test_bad_specs():
    with pytest.raises(InvalidRequest):
        FunctionSpec("f", "gpu", (), 256)
    with pytest.raises(InvalidRequest):
        FunctionSpec("f", "memory", (), 0)

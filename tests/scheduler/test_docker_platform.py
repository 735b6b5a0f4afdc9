"""The docker platform with real containers of the project's images: limits and
labels as specified, cold starts measured, keep-alive (scale to zero), metering,
failures counted by reason, clear errors for a missing image, an unreachable
engine and a container that never becomes ready, and orphans of a killed owner
removed by the next platform."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import docker
import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.errors import NotFound, Unavailable
from gnn_faas.scheduler.platform import FunctionSpec, open_platform
from gnn_faas.scheduler.platform.docker import LABEL, DockerPlatform, owner_alive
from gnn_faas.storage.datasets import ensure_dataset
from tests.docker_engine import readable_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(docker_host):
    root = readable_dir("gnn-faas-docker-platform-")
    uri = f"file://{root / 'store'}"
    ensure_dataset(uri, "bitcoin-otc")
    yield uri
    shutil.rmtree(root, ignore_errors=True)


def memory_spec(store: str, **kw) -> FunctionSpec:
    args = kw.pop("args", ("--store", store, "--graph", "bitcoin-otc"))
    return FunctionSpec(name="mem", kind="memory", args=args, **{"memory_mb": 256, **kw})


@pytest.fixture
def platform(docker_host):
    p = open_platform("docker", reaper_interval_s=None, start_timeout_s=60)
    yield p
    p.shutdown()


def container(p: DockerPlatform, instance_id: str):
    return p.client.containers.get(p.container_id(instance_id))


def test_instance_is_a_container_with_the_specified_limits(platform, store):
    inst = platform.launch(memory_spec(store, memory_mb=300, vcpus=0.5))
    assert inst.state == "ready" and inst.cold_start_s > 0
    c = container(platform, inst.id)
    hc = c.attrs["HostConfig"]
    assert hc["Memory"] == 300 * 2**20 and hc["MemorySwap"] == 300 * 2**20
    assert hc["NanoCpus"] == 500_000_000
    assert hc["NetworkMode"] == "host" and hc["ReadonlyRootfs"] is True
    assert "/tmp" in hc["Tmpfs"]
    mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
    store_path = store[len("file://") :]
    assert mounts[store_path]["RW"] is False
    labels = c.labels
    assert labels[f"{LABEL}.owner"] == platform.owner
    assert labels[f"{LABEL}.instance"] == inst.id and labels[f"{LABEL}.kind"] == "memory"
    assert owner_alive(labels) is True
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert inst.url.endswith(f":{env['PORT']}") and env["GNN_FAAS_THREADS"] == "1"
    # the function reads its limit from the container's cgroup, not from a flag
    import requests

    stats = requests.get(f"{inst.url}/v1/stats", timeout=10).json()
    assert stats["memory_limit_source"].startswith("cgroup")
    assert stats["memory_limit_bytes"] == 300 * 2**20
    assert requests.get(f"{inst.url}/_/health", timeout=10).status_code == 200


def test_keep_alive_scales_to_zero_and_meters(docker_host, store):
    clock = FakeClock()  # keep-alive and metering on the platform's clock
    platform = open_platform("docker", reaper_interval_s=None, start_timeout_s=60, clock=clock)
    try:
        inst = platform.launch(memory_spec(store, keep_alive_s=0.5))
        with platform.busy(inst.id) as busy:
            assert busy.state == "busy"
            clock.advance(0.2)
        clock.advance(0.4)
        assert platform.reap() == []  # idle 0.4 s of its 0.5 s keep-alive
        clock.advance(0.2)
        cid = platform.container_id(inst.id)
        assert platform.reap() == [inst.id]
        assert platform.instances() == []
        with pytest.raises(docker.errors.NotFound):
            platform.client.containers.get(cid)
        usage = platform.metering().instances[inst.id]
        assert usage.cold_starts == 1 and usage.busy_s == pytest.approx(0.2)
        assert usage.alive_s == pytest.approx(0.8)
        assert usage.allocated_gb_s == pytest.approx(256 / 1024 * 0.8)
    finally:
        platform.shutdown()


def test_a_killed_container_is_marked_failed_and_counted(platform, store):
    inst = platform.launch(memory_spec(store))
    container(platform, inst.id).kill()  # SIGKILL: exit 137, not an OOM kill
    deadline = time.monotonic() + 60
    states: dict = {}
    while states.get(inst.id) != "failed" and time.monotonic() < deadline:
        states = {i.id: i.state for i in platform.instances()}
        time.sleep(0.05)
    assert states[inst.id] == "failed"
    assert platform.failure_counts() == {("mem", "exit_137"): 1}
    assert platform.reap() == [inst.id]
    assert platform.failure_counts() == {("mem", "exit_137"): 1}  # counted once


def test_missing_image_is_a_clear_error(docker_host, store):
    p = DockerPlatform(images={"memory": "gnn-faas-nope:0"}, reaper_interval_s=None)
    try:
        with pytest.raises(Unavailable, match=r"gnn-faas-nope:0 not found.*make images"):
            p.launch(memory_spec(store))
        with pytest.raises(NotFound, match="gnn-faas-nope:0"):
            p.check_images(("memory",))
        assert p.failure_counts() == {("mem", "start_error"): 1}
        assert p.instances() == []
    finally:
        p.shutdown()


def test_unreachable_engine_is_a_clear_error(tmp_path):
    with pytest.raises(Unavailable, match="no Docker engine answers"):
        DockerPlatform(docker_host=f"unix://{tmp_path}/none.sock", reaper_interval_s=None)


def test_a_container_that_exits_before_ready_is_an_error_with_its_log(platform, store):
    spec = memory_spec(store, args=("--store", store, "--graph", "no-such-graph"))
    with pytest.raises(Unavailable, match=r"(?s)did not become ready.*no-such-graph"):
        platform.launch(spec)
    assert platform.failure_counts() == {("mem", "start_exit"): 1}
    left = platform.client.containers.list(
        ignore_removed=True, all=True, filters={"label": f"{LABEL}.owner={platform.owner}"}
    )
    assert left == []


def test_a_container_that_never_becomes_ready_times_out(docker_host, store):
    # it listens on another loopback address than the probe asks: alive, never ready
    p = DockerPlatform(reaper_interval_s=None, start_timeout_s=4, env={"HOST": "127.0.0.2"})
    try:
        with pytest.raises(Unavailable, match="not ready after 4 s"):
            p.launch(memory_spec(store))
        assert p.failure_counts() == {("mem", "start_timeout"): 1}
    finally:
        p.shutdown()


OWNER = textwrap.dedent(
    """
    import sys, time
    from gnn_faas.scheduler.platform import FunctionSpec
    from gnn_faas.scheduler.platform.docker import DockerPlatform

    lease = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    p = DockerPlatform(reaper_interval_s=None, owner_lease_s=lease)
    spec = FunctionSpec(name="orphan", kind="memory",
                        args=("--store", sys.argv[1], "--graph", "bitcoin-otc"), memory_mb=256)
    inst = p.launch(spec)
    print(p.container_id(inst.id), flush=True)
    time.sleep(600)
    """
)


def test_containers_of_a_killed_owner_are_removed_by_the_next_platform(platform, store):
    mine = platform.launch(memory_spec(store))  # a live owner's container stays
    proc = subprocess.Popen([sys.executable, "-c", OWNER, store], stdout=subprocess.PIPE, text=True)
    try:
        cid = proc.stdout.readline().strip()
        assert cid, "the owner process did not start its container"
    finally:
        proc.send_signal(signal.SIGKILL)  # no shutdown, no atexit: an orphan
        proc.wait(timeout=30)
    orphan = platform.client.containers.get(cid)
    assert orphan.status == "running" and owner_alive(orphan.labels) is False
    p2 = DockerPlatform(reaper_interval_s=None)
    try:
        assert orphan.name in p2.orphans_removed
        import docker

        with pytest.raises(docker.errors.NotFound):
            platform.client.containers.get(cid)
        assert container(platform, mine.id).status == "running"
    finally:
        p2.shutdown()


def test_shutdown_removes_every_container(docker_host, store):
    p = DockerPlatform(reaper_interval_s=None)
    insts = [p.launch(memory_spec(store)) for _ in range(2)]
    ids = [p.container_id(i.id) for i in insts]
    p.shutdown()
    assert p.instances() == []
    import docker

    client = docker.from_env()
    try:
        for cid in ids:
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(cid)
    finally:
        client.close()


def test_containers_of_a_killed_owner_stop_themselves_with_no_new_platform(docker_host, store):
    # the owner dies (SIGKILL: no shutdown); nothing else ever looks at its container
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER, store, "4"], stdout=subprocess.PIPE, text=True
    )
    try:
        cid = proc.stdout.readline().strip()
        assert cid, "the owner process did not start its container"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    import docker

    client = docker.from_env(timeout=30)
    try:
        c = client.containers.get(cid)
        deadline = time.monotonic() + 60  # the promise: gone within a minute
        while c.status == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
            c.reload()
        assert c.status != "running", "the container outlived its dead owner by a minute"
        assert c.attrs["State"]["ExitCode"] == 0  # a graceful stop of its own
        assert b"lease" in c.logs(tail=20)
    finally:
        with contextlib.suppress(Exception):
            client.containers.get(cid).remove(force=True)
        client.close()

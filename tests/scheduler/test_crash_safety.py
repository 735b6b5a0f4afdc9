"""Function instances die with the process that started them.

Real processes throughout; every check goes by the PIDs the platform recorded,
never by process names (other engineers' and tests' stacks run beside these).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gnn_faas.scheduler.platform.local import LocalPlatform, reap_orphans

from .test_local_platform import HEALTH_SERVER

# An owner process: a local platform whose instances are launched from a
# short-lived thread (PDEATHSIG must not follow that thread), then it waits.
OWNER = textwrap.dedent(
    """
    import json, sys, threading, time
    from gnn_faas.scheduler.platform import FunctionSpec
    from gnn_faas.scheduler.platform.local import LocalPlatform

    script, registry = sys.argv[1], sys.argv[2]
    plat = LocalPlatform(reaper_interval_s=None, registry_dir=registry,
                         command_factory=lambda spec, host: [sys.executable, script, "--host", host])
    pids = []
    def launch():
        for i in range(2):
            pids.append(plat.launch(FunctionSpec(name=f"fn{i}", kind="memory", args=(), memory_mb=64)).pid)
    t = threading.Thread(target=launch)
    t.start(); t.join()  # the launching thread is gone now
    time.sleep(0.5)
    print(json.dumps(pids), flush=True)
    time.sleep(600)
    """
)


def gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            return True
        time.sleep(0.1)
    return False


def tree(pid: int) -> list[int]:
    p = psutil.Process(pid)
    return [pid, *(c.pid for c in p.children(recursive=True))]


def test_instances_die_with_a_sigkilled_owner(tmp_path):
    script = tmp_path / "health.py"
    script.write_text(HEALTH_SERVER)
    owner_py = tmp_path / "owner.py"
    owner_py.write_text(OWNER)
    registry = tmp_path / "registry"
    owner = subprocess.Popen(
        [sys.executable, str(owner_py), str(script), str(registry)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = json.loads(owner.stdout.readline())
        assert len(pids) == 2
        # alive although the thread that launched them has exited
        assert all(psutil.pid_exists(p) for p in pids)
        records = [json.loads(p.read_text()) for p in registry.glob("*.json")]
        assert sorted(r["pid"] for r in records) == sorted(pids)
        assert {r["owner_pid"] for r in records} == {owner.pid}
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert gone(pids), "instances outlived their SIGKILLed owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()


def test_a_new_platform_reaps_orphans_of_dead_owners_only(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    kept = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    me = psutil.Process(os.getpid())
    try:

        def record(name: str, proc, owner_pid: int, owner_t: float) -> None:
            rec = {
                "id": name,
                "pid": proc.pid,
                "create_time": psutil.Process(proc.pid).create_time(),
                "owner_pid": owner_pid,
                "owner_create_time": owner_t,
            }
            (registry / f"{owner_pid}-{name}.json").write_text(json.dumps(rec))

        record("orphan", orphan, dead.pid, 1.0)  # its owner is gone
        record("kept", kept, me.pid, me.create_time())  # its owner (this test) lives
        plat = LocalPlatform(reaper_interval_s=None, registry_dir=registry)
        try:
            assert plat.reaped_orphans == [orphan.pid]
            orphan.wait(timeout=5)
            assert kept.poll() is None
            assert [p.name for p in registry.glob("*.json")] == [f"{me.pid}-kept.json"]
            assert reap_orphans(registry) == []  # idempotent
        finally:
            plat.shutdown()
    finally:
        for p in (orphan, kept):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def up_config(tmp_path_factory):
    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model
    from gnn_faas.storage.datasets import ensure_dataset

    root = tmp_path_factory.mktemp("crash")
    store = f"file://{root / 'store'}"
    graph = ensure_dataset(store, "bitcoin-otc")
    cfg = ModelConfig(arch="gcn", in_dim=graph.manifest.feature_dim, hidden_dim=16, out_dim=2,
                      num_layers=2, num_classes=2, graph="bitcoin-otc")  # fmt: skip
    save_checkpoint(root / "ckpt", cfg, build_model(cfg, seed=1).eval().state_dict())
    return {
        "store": store,
        "platform": {"max_memory_instances": 1, "max_compute_instances": 1},
        "models": [{"name": "btc", "graph": "bitcoin-otc", "checkpoint": str(root / "ckpt")}],
    }


def instance_pids(stack) -> list[int]:
    pids = []
    for inst in stack.status()["instances"]:
        if inst["state"] not in ("stopped", "failed"):
            pids += tree(inst["pid"])
    return pids


def infer_ok(url: str) -> bool:
    import requests

    body = {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [1], "data": [3]}]}
    return requests.post(f"{url}/v2/models/btc/infer", json=body, timeout=30).status_code == 200


@pytest.mark.slow
def test_sigkill_of_the_gateway_worker_then_of_gnn_faas_up(up_config, tmp_path, monkeypatch):
    from gnn_faas.health import probe_ready
    from gnn_faas.stack import Stack

    env_dir = tmp_path / "run"
    monkeypatch.setenv("GNN_FAAS_RUN_DIR", str(env_dir))  # a registry away from others'
    if True:
        with Stack(up_config, ready_timeout_s=120) as stack:
            assert infer_ok(stack.url)
            master = psutil.Process(stack.proc.pid)
            (worker,) = master.children()
            first = instance_pids(stack)
            assert first
            # 1. the worker dies (an OOM kill): its instances go with it ...
            worker.send_signal(signal.SIGKILL)
            assert gone(first), "instances outlived the SIGKILLed gateway worker"
            # ... and the worker gunicorn starts in its place serves again
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not probe_ready(stack.url):
                time.sleep(0.2)
            assert infer_ok(stack.url)
            (worker2,) = master.children()
            assert worker2.pid != worker.pid
            second = instance_pids(stack)
            assert second and not set(second) & set(first)
            # 2. `gnn-faas up` itself is SIGKILLed: worker and instances follow
            master.send_signal(signal.SIGKILL)
            assert gone([worker2.pid, *second], timeout=30), "orphans after killing gnn-faas up"
        assert not list(Path(env_dir / "instances").glob("*.json"))

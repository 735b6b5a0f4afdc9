"""The owner lease: an instance ends itself once its owner stops renewing.

Real processes: an owner process holds a :class:`LocalPlatform` whose instance
is a real gunicorn server (tests/functions/front_app.py); killing the owner,
its instance's server master and workers are gone within the lease's bound.
Checks go by PIDs, polled; no timing is asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from gnn_faas.owner_lease import (
    LEASE_ENV,
    TIMEOUT_ENV,
    OwnerLease,
    expired,
    watch,
)

REPO = Path(__file__).resolve().parents[1]


def _poll(cond, limit_s: float = 60.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_a_renewed_lease_holds_and_a_closed_one_fires_the_watch():
    lease = OwnerLease(renew_s=0.05, timeout_s=0.5)
    fired = []
    try:
        first = os.stat(lease.path).st_mtime_ns
        assert _poll(lambda: os.stat(lease.path).st_mtime_ns > first)  # renewed
        watch(lease.path, 0.5, on_expiry=lambda: fired.append(time.time()))
        assert not expired(lease.path, 0.5)
        assert oct(os.stat(lease.dir).st_mode & 0o777) == "0o755"  # a container user reads it
    finally:
        lease.close()
    assert not lease.dir.exists()
    assert _poll(lambda: bool(fired))


def test_an_unrenewed_lease_expires():
    lease = OwnerLease(renew_s=1.0, timeout_s=2.0)
    try:
        lease._stop.set()  # the owner is frozen or dead: no more renewals
        assert not expired(lease.path, 2.0)
        assert expired(lease.path, 2.0, now=time.time() + 3.0)
    finally:
        lease.close()


def test_a_server_stops_itself_when_its_lease_lapses(tmp_path):
    lease = OwnerLease(renew_s=0.2, timeout_s=1.0, parent=tmp_path)
    env = {**os.environ, LEASE_ENV: str(lease.path), TIMEOUT_ENV: "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.functions.front_app", "2", "16", "5", "1000"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert "listening on" in proc.stdout.readline()
        assert _poll(lambda: bool(psutil.Process(proc.pid).children()))
        workers = psutil.Process(proc.pid).children()
        assert proc.poll() is None  # serving while the lease is renewed
        lease.close()  # the owner is gone
        assert _poll(lambda: proc.poll() is not None)
        assert proc.returncode == 0  # a graceful stop
        assert "lease" in proc.stdout.read()
        assert _poll(lambda: not any(w.is_running() and w.status() != "zombie" for w in workers))
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


OWNER = textwrap.dedent(
    """
    import json, sys, time
    from gnn_faas.scheduler.platform import FunctionSpec
    from gnn_faas.scheduler.platform.local import LocalPlatform

    repo, registry = sys.argv[1], sys.argv[2]
    cmd = [sys.executable, "-m", "tests.functions.front_app", "2", "16", "5", "1000"]
    plat = LocalPlatform(reaper_interval_s=None, registry_dir=registry, owner_lease_s=2.0,
                         command_factory=lambda spec, host: cmd)
    inst = plat.launch(FunctionSpec(name="fn", kind="memory", args=(), memory_mb=64))
    print(json.dumps(inst.pid), flush=True)
    time.sleep(600)
    """
)


def test_a_killed_owner_and_its_instance_masters_leave_no_process(tmp_path):
    import json

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(REPO), str(tmp_path / "registry")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        master = json.loads(owner.stdout.readline())
        procs = [psutil.Process(master), *psutil.Process(master).children(recursive=True)]
        # gateway and functions killed together: the owner and the instance's master
        owner.send_signal(signal.SIGKILL)
        os.kill(master, signal.SIGKILL)
        owner.wait(30)
        assert _poll(lambda: not any(p.is_running() and p.status() != "zombie" for p in procs))
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)

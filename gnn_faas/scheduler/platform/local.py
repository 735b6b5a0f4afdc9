"""The embedded platform: function instances as local processes (docs/architecture.md, principle 3).

Each instance is ``python -m gnn_faas serve KIND *args --host H --port 0`` (plus
``--memory-mb M`` for memory functions) in its own process group, its output in a
log file per instance. The instance binds a free port itself and prints its URL;
the platform reads it from the log and polls ``GET {url}/v2/health/ready`` until
200. That spawn-to-ready wall time is the instance's *cold start*. If the process
exits or ``start_timeout_s`` passes first, the instance is killed and
:class:`~gnn_faas.errors.Unavailable` carries the tail of its log.

An instance's thread pools follow its billed ``vcpus`` (``GNN_FAAS_THREADS``,
``OMP_NUM_THREADS``, ... set to ``ceil(vcpus)``). ``stop`` sends SIGTERM to the
process group, waits ``stop_grace_s``, then SIGKILLs what is left; every child is
waited for. The instance table, ``busy``, keep-alive and the reaper are
:class:`~gnn_faas.scheduler.platform.managed.ManagedPlatform`'s; this module
provides its hooks. Times come from ``clock`` (a :class:`~gnn_faas.clock.FakeClock`
makes keep-alive and metering deterministic while the processes stay real).

Crash safety: instances die with the process that started them, even a SIGKILLed
one: ``PR_SET_PDEATHSIG`` set by one long-lived spawner thread, and an instance
registry under ``$GNN_FAAS_RUN_DIR`` from which a new platform reaps the instances
of a dead owner (checked by PID and start time). Why both: docs/design/local-platform.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from gnn_faas.clock import Clock
from gnn_faas.errors import Unavailable
from gnn_faas.health import probe_ready
from gnn_faas.owner_lease import DEFAULT_TIMEOUT_S as DEFAULT_LEASE_S
from gnn_faas.owner_lease import OwnerLease
from gnn_faas.parent_death import die_with
from gnn_faas.scheduler.platform.base import FunctionSpec, Instance
from gnn_faas.scheduler.platform.managed import ManagedPlatform, Running

log = logging.getLogger(__name__)

LISTENING = re.compile(rb"listening on (https?://[^\s]+)")
THREAD_VARS = ("GNN_FAAS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CommandFactory = Callable[[FunctionSpec, str], list[str]]


def default_registry_dir() -> Path:
    env = os.environ.get("GNN_FAAS_RUN_DIR")
    if env:
        return Path(env) / "instances"
    return Path(tempfile.gettempdir()) / f"gnn-faas-{os.getuid()}" / "instances"


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def reap_orphans(registry_dir: str | Path) -> list[int]:
    """Kill the instances recorded in ``registry_dir`` whose owner process is
    gone; returns their PIDs. Records of live owners are left alone."""
    killed = []
    root = Path(registry_dir)
    if not root.is_dir():
        return killed
    for path in root.glob("*.json"):
        try:
            rec = json.loads(path.read_text())
            owner, owner_t = int(rec["owner_pid"]), float(rec["owner_create_time"])
            pid, pid_t = int(rec["pid"]), float(rec["create_time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _create_time(owner) == owner_t:
            continue  # its owner still runs: not an orphan
        if _create_time(pid) == pid_t:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # its own session: the group is its pid
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
            killed.append(pid)
            log.warning("reaped orphaned instance %s (pid %d) of dead owner %d",
                        rec.get("id"), pid, owner)  # fmt: skip
        with contextlib.suppress(OSError):
            path.unlink()
    return killed


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


class LocalPlatform(ManagedPlatform):
    """Function instances as processes on this machine."""

    name = "local"

    def __init__(
        self,
        clock: Clock | None = None,
        host: str = "127.0.0.1",
        log_dir: str | Path | None = None,
        python: str = sys.executable,
        start_timeout_s: float = 30.0,
        reaper_interval_s: float | None = 1.0,
        *,
        command_factory: CommandFactory | None = None,
        stop_grace_s: float = 5.0,
        env: dict[str, str] | None = None,
        registry_dir: str | Path | None = None,
        owner_lease_s: float | None = DEFAULT_LEASE_S,
    ):
        """``command_factory(spec, host)``: the argv of an instance (default:
        ``gnn-faas serve``); it must print the ``listening on URL`` line and
        serve ``/v2/health/ready``. ``reaper_interval_s=None``: no reaper
        thread (call :meth:`reap` yourself). ``env``: extra environment for
        every instance. ``registry_dir``: where instances are recorded for
        crash recovery (default :func:`default_registry_dir`); orphans of dead
        owners found there are reaped now. ``owner_lease_s``: an instance (its
        server master) stops itself once this platform's owner lease has not been
        renewed for that long, a second guard beside the parent-death signal
        (owner_lease.py); ``None``: no lease."""
        super().__init__(clock, stop_grace_s)
        self.host = host
        self.python = python
        self.start_timeout_s = float(start_timeout_s)
        self.command_factory = command_factory or self.serve_command
        self.extra_env = dict(env or {})
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="gnn-faas-instances-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.registry_dir = Path(registry_dir) if registry_dir else default_registry_dir()
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self.reaped_orphans = reap_orphans(self.registry_dir)
        self._pid = os.getpid()
        self._pid_t = _create_time(self._pid)
        # every fork happens on this one long-lived thread: PDEATHSIG follows the thread
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gnn-faas-spawner")
        self.lease = (
            OwnerLease(renew_s=owner_lease_s / 6, timeout_s=owner_lease_s)
            if owner_lease_s
            else None
        )
        self._start_reaper(reaper_interval_s)

    # -- commands ----------------------------------------------------------------
    def serve_command(self, spec: FunctionSpec, host: str) -> list[str]:
        """``python -m gnn_faas serve KIND *args --host H --port 0 [--memory-mb M]``."""
        argv = [self.python, "-m", "gnn_faas", "serve", spec.kind, *spec.args]
        argv += ["--host", host, "--port", "0"]
        if spec.kind == "memory":
            argv += ["--memory-mb", str(spec.memory_mb)]
        return argv

    def _environment(self, spec: FunctionSpec) -> dict[str, str]:
        env = dict(os.environ)
        # The child must import this very gnn_faas, installed or not.
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        threads = str(max(1, math.ceil(spec.vcpus)))
        env.update({var: threads for var in THREAD_VARS})
        env.update(self.extra_env)
        if self.lease is not None:
            env.update(self.lease.env())
        env.update(dict(spec.env))
        return env

    # -- lifecycle ---------------------------------------------------------------
    def launch(self, spec: FunctionSpec) -> Instance:
        self._check_open()
        iid = self._new_id(spec)
        log_path = self.log_dir / f"{iid}.log"
        argv = self.command_factory(spec, self.host)
        t0 = time.perf_counter()
        try:
            # The child holds its own copy of the log descriptor; ours closes now.
            with open(log_path, "wb") as log_file:
                proc = self._spawner.submit(
                    subprocess.Popen,
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=self._environment(spec),
                    start_new_session=True,  # its own process group: stop kills workers too
                    close_fds=True,
                    preexec_fn=die_with(os.getpid()),
                ).result()
            self._record(iid, proc.pid)
        except OSError as exc:
            raise Unavailable(f"cannot start {spec.name}: {exc}") from None
        run = self._register(iid, spec, proc, url="", pid=proc.pid, at=self.clock.now())
        log.info("launching %s: %s", iid, " ".join(argv))

        url, reason = self._wait_ready(proc, log_path, t0 + self.start_timeout_s)
        if url is None:
            self._terminate(run, grace=0.0)
            with self._lock:
                run.instance.state = "failed"
            self.meter.stop(iid)
            tail = _tail(log_path)
            raise Unavailable(
                f"instance {iid} of {spec.name!r} did not become ready: {reason}"
                + (f"; log tail:\n{tail}" if tail else "")
            )
        return self._mark_ready(run, time.perf_counter() - t0, url=url)

    def _wait_ready(
        self, proc: subprocess.Popen, log_path: Path, deadline: float
    ) -> tuple[str | None, str]:
        """Poll for the listening line, then for a 200 from the readiness probe."""
        url: str | None = None
        pause = 0.01
        while True:
            code = proc.poll()
            if code is not None:
                return None, f"the process exited with status {code}"
            if url is None:
                try:
                    match = LISTENING.search(log_path.read_bytes())
                except OSError:
                    match = None
                if match:
                    url = match.group(1).decode().rstrip("/")
            if url is not None and probe_ready(url):
                return url, ""
            if time.perf_counter() >= deadline:
                return None, f"not ready after {self.start_timeout_s:g} s"
            time.sleep(pause)
            pause = min(0.1, pause * 1.5)

    def _record_path(self, iid: str) -> Path:
        return self.registry_dir / f"{self._pid}-{iid}.json"

    def _record(self, iid: str, pid: int) -> None:
        rec = {
            "id": iid,
            "pid": pid,
            "create_time": _create_time(pid),
            "owner_pid": self._pid,
            "owner_create_time": self._pid_t,
        }
        tmp = self._record_path(iid).with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self._record_path(iid))

    # -- hooks of ManagedPlatform ----------------------------------------------------
    def _terminate(self, run: Running, grace: float, *, count_exit: bool = False) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace``; wait
        for every process so none is left a zombie; drop its registry record."""
        proc: subprocess.Popen = run.handle
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        try:
            proc.wait(timeout=grace if grace > 0 else 5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # Workers the leader did not take down with it (psutil checks pid reuse).
        _, alive = psutil.wait_procs(children, timeout=grace if grace > 0 else 0.5)
        for child in alive:
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(alive, timeout=1.0)
        with contextlib.suppress(OSError):
            self._record_path(run.instance.id).unlink()

    def _terminate_all(self, runs: list[tuple[str, Running]], grace: float) -> None:
        """SIGTERM every process group first, then wait: one grace period, not n,
        and no thread per instance."""
        for _, run in runs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.handle.pid, signal.SIGTERM)
        for _, run in runs:
            self._terminate(run, grace)

    def _exited(self, live: dict[str, Running], force: bool) -> dict[str, str]:
        """The processes that exited (``Popen.poll``), by exit status."""
        codes = {iid: run.handle.poll() for iid, run in live.items()}
        return {iid: f"exited with status {c}" for iid, c in codes.items() if c is not None}

    def _on_failure(self, run: Running, reason: str) -> None:
        self._terminate(run, grace=0.0)  # its workers, if any survived it

    def _close(self) -> None:
        if self.lease is not None:
            self.lease.close()
        self._spawner.shutdown(wait=False)
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    # -- queries -----------------------------------------------------------------
    def log_path(self, instance_id: str) -> Path:
        """The instance's log file (kept after it stops, until shutdown)."""
        return self.log_dir / f"{instance_id}.log"

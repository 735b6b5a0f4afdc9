"""The docker platform: function instances as containers of the project's images.

Each instance is one container of the function's image (``gnn-faas-memory`` or
``gnn-faas-compute``, built by ``make images``) created through the Docker Engine
API with ``mem_limit = memswap_limit = memory_mb`` (a real limit: exceeding it is an
OOM kill) and ``nano_cpus = vcpus · 10⁹``; ``network_mode="host"`` with ``HOST``
and a free loopback ``PORT``; a read-only root filesystem with a tmpfs ``/tmp``, as
the image's non-root user; read-only bind mounts, at the same paths, of the
``file://`` store, checkpoint and peak-predictor file its arguments name. Memory
functions size their cache from the container's cgroup limit unless
``memory_aware_cache`` is off (FaaS-GNN 4.3's baseline).

Cold start: from just before the container is created to the first 200 of
``/v2/health/ready``; a container that exits first or is not ready within
``start_timeout_s`` is removed and :class:`~gnn_faas.errors.Unavailable` carries
its log's tail. A container that exits while serving is marked ``failed`` (the
pool retries its work elsewhere); :meth:`DockerPlatform.failure_counts` counts
failures by reason (``oom``, ``exit_<code>``, ``start_timeout``, ``start_exit``,
``start_error``) for ``/metrics``.

Every container is labelled with its owner (id, pid, start time, host, pid
namespace): a new platform removes those of a dead owner, :meth:`shutdown` (also
at exit) its own. Keep-alive, ``busy`` and metering are
:class:`~gnn_faas.scheduler.platform.managed.ManagedPlatform`'s; this module
provides its hooks. The full description: docs/design/docker-platform.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import socket
import stat
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from gnn_faas.clock import Clock
from gnn_faas.errors import InvalidRequest, MissingExtra, NotFound, Unavailable
from gnn_faas.health import probe_ready
from gnn_faas.owner_lease import DEFAULT_TIMEOUT_S as DEFAULT_LEASE_S
from gnn_faas.owner_lease import LEASE_ENV, OwnerLease
from gnn_faas.ports import free_port
from gnn_faas.scheduler.platform.base import FunctionSpec, Instance
from gnn_faas.scheduler.platform.managed import ManagedPlatform, Running

log = logging.getLogger(__name__)

LABEL = "io.gnn-faas"
LEASE_MOUNT = "/gnn-faas-lease"  # where a container sees its owner's lease directory
LEASE_DIR_ENV = "GNN_FAAS_LEASE_DIR"  # a host directory for the lease (see _owner_lease)
IN_CONTAINER_ENV = "GNN_FAAS_IN_CONTAINER"  # set by the gateway image
THREAD_VARS = ("GNN_FAAS_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_IMAGES = {"memory": "gnn-faas-memory:latest", "compute": "gnn-faas-compute:latest"}
# arguments whose value is a path on this machine that the container must see
PATH_ARGS = {"--store": "store", "--model": "checkpoint", "--predictor": "predictor"}


def _docker():
    try:
        import docker
    except ImportError:
        raise MissingExtra("the docker platform", "docker", "docker") from None
    return docker


def owner_scope() -> str:
    """``hostname/pid-namespace``: where an owner's pid means something."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "pid:?"
    return f"{socket.gethostname()}/{ns}"


def _process_start(pid: int) -> str:
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return ""


def owner_alive(labels: dict[str, str]) -> bool | None:
    """Whether the process that labelled a container still runs: ``None`` when
    it cannot be told from here (another host or pid namespace)."""
    if labels.get(f"{LABEL}.owner-scope") != owner_scope():
        return None
    try:
        pid = int(labels.get(f"{LABEL}.owner-pid", ""))
    except ValueError:
        return False
    return _process_start(pid) == labels.get(f"{LABEL}.owner-start", "")


def bind_sources(spec: FunctionSpec) -> list[str]:
    """Paths on this machine that the spec's arguments name (store, checkpoint,
    predictor), to bind-mount read-only at the same paths."""
    out: list[str] = []
    args = list(spec.args)
    for flag, value in zip(args, args[1:]):
        if flag not in PATH_ARGS:
            continue
        if flag == "--store":
            if not value.startswith("file://"):
                continue  # s3:// and redis:// are reached over the network
            value = value[len("file://") :].split("?", 1)[0]
        out.append(str(Path(value).resolve()))
    return out


def check_readable(path: str, what: str) -> None:
    """The container's user (not this one) must be able to read ``path``: every
    directory on the way needs o+x, the target o+r (and o+x for a directory)."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"{what} {path} does not exist")
    for parent in reversed(p.parents):
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise InvalidRequest(
                f"{what} {path} is not readable inside the container (it runs as uid 10001): "
                f"{parent} lacks o+x; chmod o+rx {parent}"
            )
    # the path itself and what lies up to two levels below it (a store's graphs' blobs, a
    # checkpoint's files)
    todo = [p]
    if p.is_dir():
        for child in p.iterdir():
            todo.append(child)
            if child.is_dir():
                todo.extend(child.iterdir())
    for q in todo:
        mode = q.stat().st_mode
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            raise InvalidRequest(
                f"{what} {path} is not readable inside the container (it runs as uid 10001): "
                f"{q} lacks o+r{'x' if stat.S_ISDIR(mode) else ''}; chmod -R o+rX {path}"
            )


class DockerPlatform(ManagedPlatform):
    """Function instances as containers (see the module docstring)."""

    name = "docker"
    reaper_name = "gnn-faas-docker-reaper"

    def __init__(
        self,
        clock: Clock | None = None,
        docker_host: str | None = None,
        images: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 60.0,
        reaper_interval_s: float | None = 1.0,
        *,
        memory_aware_cache: bool = True,
        stop_grace_s: float = 5.0,
        tmpfs_mb: int = 64,
        env: dict[str, str] | None = None,
        client: Any = None,
        owner_lease_s: float | None = DEFAULT_LEASE_S,
    ):
        """``docker_host``: the engine (default: ``$DOCKER_HOST``, else the
        default socket). ``images``: image per kind (default
        :data:`DEFAULT_IMAGES`). ``reaper_interval_s=None``: no reaper thread
        (call :meth:`reap` yourself). ``env``: extra environment for every
        container. Raises :class:`~gnn_faas.errors.Unavailable` when no engine
        answers. ``owner_lease_s``: each container stops itself once this
        platform's owner lease has not been renewed for that long (the gateway
        died; see owner_lease.py); ``None``: no lease."""
        docker = _docker()
        super().__init__(clock, stop_grace_s)
        self.host = host
        self.images = {**DEFAULT_IMAGES, **(images or {})}
        self.start_timeout_s = float(start_timeout_s)
        self.memory_aware_cache = bool(memory_aware_cache)
        self.tmpfs_mb = int(tmpfs_mb)
        self.extra_env = dict(env or {})
        self.docker_host = docker_host or os.environ.get("DOCKER_HOST") or "the default socket"
        if client is None:
            try:
                client = (
                    docker.DockerClient(base_url=docker_host, timeout=30)
                    if docker_host
                    else docker.from_env(timeout=30)
                )
                client.ping()
            except Exception as exc:  # DockerException, requests' ConnectionError, ...
                raise Unavailable(
                    f"no Docker engine answers at {self.docker_host} ({type(exc).__name__}: "
                    f"{exc}); start one (`make images` starts one under build/docker) or set "
                    "DOCKER_HOST"
                ) from None
        self.client = client
        self.owner = uuid.uuid4().hex
        pid = os.getpid()
        self._owner_labels = {
            f"{LABEL}.platform": "docker",
            f"{LABEL}.owner": self.owner,
            f"{LABEL}.owner-pid": str(pid),
            f"{LABEL}.owner-start": _process_start(pid),
            f"{LABEL}.owner-scope": owner_scope(),
        }
        self._failures: Counter[tuple[str, str]] = Counter()
        self._last_poll = 0.0
        self.orphans_removed = self.remove_orphans()
        self.lease = self._owner_lease(owner_lease_s)
        self._start_reaper(reaper_interval_s)

    @staticmethod
    def _owner_lease(timeout_s: float | None) -> OwnerLease | None:
        """The lease the containers watch, in a directory the engine can bind-mount.

        The engine resolves a bind mount's source on its own host: a gateway that
        runs in a container (the gateway image beside the engine's socket) can
        share a lease only through a directory mounted at the same path on both
        sides, named by ``$GNN_FAAS_LEASE_DIR``; without one it runs without a
        lease (orphans are then removed by the next gateway's start). The gateway
        image says it is one by ``$GNN_FAAS_IN_CONTAINER``."""
        if not timeout_s:
            return None
        parent = os.environ.get(LEASE_DIR_ENV) or None
        if parent is None and os.environ.get(IN_CONTAINER_ENV):
            log.warning(
                "running in a container without $%s: function containers get no owner lease",
                LEASE_DIR_ENV,
            )
            return None
        return OwnerLease(renew_s=timeout_s / 6, timeout_s=timeout_s, parent=parent)

    # -- preflight -----------------------------------------------------------------
    def check_images(self, kinds: tuple[str, ...] = ("memory", "compute")) -> None:
        """Raise :class:`~gnn_faas.errors.NotFound` naming every missing image."""
        docker = _docker()
        missing = []
        for kind in kinds:
            try:
                self.client.images.get(self.images[kind])
            except docker.errors.ImageNotFound:
                missing.append(self.images[kind])
        if missing:
            raise NotFound(
                f"image(s) {', '.join(missing)} not found in the Docker engine at "
                f"{self.docker_host}; build them with `make images`"
            )

    def remove_orphans(self) -> list[str]:
        """Remove containers labelled by a platform whose process is gone (a
        gateway that was killed); the names removed."""
        removed = []
        try:
            found = self.client.containers.list(
                ignore_removed=True, all=True, filters={"label": f"{LABEL}.platform=docker"}
            )
        except Exception as exc:
            log.warning("cannot list containers to reap orphans: %s", exc)
            return removed
        for c in found:
            labels = c.labels or {}
            if labels.get(f"{LABEL}.owner") == self.owner or owner_alive(labels) is not False:
                continue
            with contextlib.suppress(Exception):
                c.remove(force=True)
                removed.append(c.name)
        if removed:
            log.warning("removed %d orphaned function container(s): %s", len(removed), removed)
        return removed

    # -- lifecycle -------------------------------------------------------------------
    def _container_args(self, spec: FunctionSpec, iid: str, port: int) -> dict[str, Any]:
        docker = _docker()
        command = list(spec.args)
        if spec.kind == "memory" and not self.memory_aware_cache:
            # told the machine's memory, the cache grows past the container's real limit
            command += ["--memory-mb", str(psutil.virtual_memory().total // 2**20)]
        threads = str(max(1, math.ceil(spec.vcpus)))
        env = {"HOST": self.host, "PORT": str(port), **{v: threads for v in THREAD_VARS}}
        env.update(self.extra_env)
        env.update(dict(spec.env))
        mounts = []
        for path in dict.fromkeys(bind_sources(spec)):
            check_readable(path, f"{spec.name}'s")
            mounts.append(docker.types.Mount(path, path, type="bind", read_only=True))
        if self.lease is not None:  # read-only: the container only watches its mtime
            mounts.append(
                docker.types.Mount(LEASE_MOUNT, str(self.lease.dir), type="bind", read_only=True)
            )
            env.update(self.lease.env())
            env[LEASE_ENV] = f"{LEASE_MOUNT}/{self.lease.path.name}"
        limit = int(spec.memory_mb) * 2**20
        name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"gnn-faas-{self.owner[:8]}-{iid}")
        return dict(
            image=self.images[spec.kind],
            command=command,
            name=name,
            environment=env,
            labels={
                **self._owner_labels,
                f"{LABEL}.instance": iid,
                f"{LABEL}.function": spec.name,
                f"{LABEL}.kind": spec.kind,
            },
            mounts=mounts,
            network_mode="host",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.tmpfs_mb}m,mode=1777"},
            mem_limit=limit,
            memswap_limit=limit,
            nano_cpus=int(spec.vcpus * 1e9),
        )

    def launch(self, spec: FunctionSpec) -> Instance:
        self._check_open()
        docker = _docker()
        if spec.kind not in self.images:
            raise Unavailable(f"no image for function kind {spec.kind!r}")
        iid = self._new_id(spec)
        port = free_port(self.host)
        kwargs = self._container_args(spec, iid, port)
        t0 = time.perf_counter()
        now = self.clock.now()
        try:
            # create + start, not run: run would try to pull a missing image from a registry
            container = self.client.containers.create(**kwargs)
        except docker.errors.ImageNotFound:
            self._count(spec.name, "start_error")
            raise Unavailable(
                f"cannot start {spec.name}: image {kwargs['image']} not found in the Docker "
                f"engine at {self.docker_host}; build it with `make images`"
            ) from None
        except Exception as exc:  # APIError, engine gone
            self._count(spec.name, "start_error")
            raise Unavailable(f"cannot start {spec.name}: {exc}") from None
        try:
            container.start()
        except Exception as exc:
            self._count(spec.name, "start_error")
            self._remove(container.id, grace=0.0)
            raise Unavailable(f"cannot start {spec.name}: {exc}") from None
        run = self._register(
            iid, spec, container.id, url=f"http://{self.host}:{port}", pid=None, at=now
        )
        inst = run.instance
        log.info("launching %s: container %s of %s", iid, container.name, kwargs["image"])

        reason = self._wait_ready(container, inst.url, t0 + self.start_timeout_s)
        if reason is not None:
            tail = self._logs(container)
            with self._lock:
                inst.state = "failed"
                self._running.pop(iid, None)
            self.meter.stop(iid)
            self._count(spec.name, reason[0])
            self._remove(container.id, grace=0.0)
            raise Unavailable(
                f"instance {iid} of {spec.name!r} (image {kwargs['image']}) did not become "
                f"ready: {reason[1]}" + (f"; log tail:\n{tail}" if tail else "")
            )
        cold = time.perf_counter() - t0
        with contextlib.suppress(Exception):
            container.reload()
        pid = (container.attrs.get("State") or {}).get("Pid") or None
        return self._mark_ready(run, cold, pid=pid)

    def _wait_ready(self, container, url: str, deadline: float) -> tuple[str, str] | None:
        """``None`` once ready, else ``(reason, message)``."""
        pause, next_check = 0.01, 0.0
        while True:
            if probe_ready(url, timeout=1.0):
                return None
            now = time.perf_counter()
            if now >= next_check:  # the engine is asked less often than the probe runs
                next_check = now + 0.2
                try:
                    container.reload()
                    state = container.attrs.get("State") or {}
                except Exception as exc:
                    return "start_error", f"the engine lost the container ({exc})"
                if state.get("Status") in ("exited", "dead"):
                    why = "out of memory" if state.get("OOMKilled") else "it exited"
                    return "start_exit", f"{why} with status {state.get('ExitCode')}"
            if now >= deadline:
                return "start_timeout", f"not ready after {self.start_timeout_s:g} s"
            time.sleep(pause)
            pause = min(0.05, pause * 1.5)

    def _logs(self, container, limit: int = 2000) -> str:
        try:
            return container.logs(tail=30).decode("utf-8", "replace").strip()[-limit:]
        except Exception:
            return ""

    def _remove(self, container_id: str, grace: float) -> dict:
        """Stop (SIGTERM, ``grace`` seconds, SIGKILL) and remove a container; its
        final ``State`` (empty if it was gone already)."""
        state: dict = {}
        try:
            c = self.client.containers.get(container_id)
            if grace > 0 and c.status == "running":
                c.stop(timeout=max(1, int(math.ceil(grace))))
            c.reload()
            state = c.attrs.get("State") or {}
            c.remove(force=True)
        except Exception as exc:  # already gone (NotFound), or the engine is
            log.debug("removing %s: %s", container_id[:12], exc)
        return state

    def _count(self, function: str, reason: str) -> None:
        with self._lock:
            self._failures[(function, reason)] += 1

    @staticmethod
    def failure_reason(state: dict) -> str:
        """``oom`` when the kernel killed for memory, else ``exit_<code>``."""
        if state.get("OOMKilled"):
            return "oom"
        return f"exit_{state.get('ExitCode')}"

    # -- hooks of ManagedPlatform ----------------------------------------------------------
    def _terminate(self, run: Running, grace: float, *, count_exit: bool = False) -> None:
        """Stop and remove the container (:meth:`_remove`). ``count_exit``: the
        pool stops an instance whose call failed, maybe before :meth:`_poll` saw
        it exit; such an exit (or an OOM kill) is counted as a failure."""
        exited_before = count_exit and self._exits_soon(run.handle)
        state = self._remove(run.handle, grace)
        if count_exit and (exited_before or state.get("OOMKilled")):
            self._count(run.instance.spec.name, self.failure_reason(state))

    def _exits_soon(self, container_id: str, within_s: float = 1.0) -> bool:
        """Whether the container has exited or does within ``within_s``. A call
        fails the moment a killed container's socket closes, often before the
        engine has reaped it and shows it ``exited``: asking once then missed
        the kill (and its failure count) under load. The engine's wait answers
        at the exit; a container still running after ``within_s`` (the wait
        times out) is one we stop ourselves, one already gone tells nothing."""
        try:
            self.client.api.wait(container_id, timeout=within_s)
        except Exception:  # timed out (still running) or removed already
            return False
        return True

    def _exited(self, live: dict[str, Running], force: bool) -> dict[str, str]:
        """The containers that exited, by :meth:`failure_reason`: one engine call
        for all of them, at most every 0.2 s unless ``force``."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_poll < 0.2:
                return {}
            self._last_poll = now
        try:
            exited = self.client.api.containers(
                all=True,
                filters={"label": f"{LABEL}.owner={self.owner}", "status": ["exited", "dead"]},
            )
        except Exception as exc:
            log.debug("polling containers failed: %s", exc)
            return {}
        by_container = {run.handle: iid for iid, run in live.items()}
        out = {}
        for row in exited:
            iid = by_container.get(row["Id"])
            if iid is None:
                continue
            try:
                state = self.client.api.inspect_container(row["Id"]).get("State") or {}
            except Exception:
                state = {}
            out[iid] = self.failure_reason(state)
        return out

    def _on_failure(self, run: Running, reason: str) -> None:
        self._count(run.instance.spec.name, reason)

    def _drop_failed(self, run: Running) -> None:
        self._remove(run.handle, grace=0.0)

    def _terminate_all(self, runs: list[tuple[str, Running]], grace: float) -> None:
        """Every container at once, then anything of ours the table lost track
        of (a launch cut short)."""
        super()._terminate_all(runs, grace)
        with contextlib.suppress(Exception):
            for c in self.client.containers.list(
                ignore_removed=True, all=True, filters={"label": f"{LABEL}.owner={self.owner}"}
            ):
                c.remove(force=True)

    def _close(self) -> None:
        if self.lease is not None:
            self.lease.close()
        with contextlib.suppress(Exception):
            self.client.close()

    # -- queries ------------------------------------------------------------------------
    def container_id(self, instance_id: str) -> str:
        """The container of an instance (tests and tools inspect or kill it)."""
        with self._lock:
            run = self._running.get(instance_id)
            if run is None:
                raise NotFound(f"no instance {instance_id!r}")
            return run.handle

    def failure_counts(self) -> dict[tuple[str, str], int]:
        """``{(function, reason): count}`` of instances that failed."""
        self._poll()
        with self._lock:
            return dict(self._failures)


def preflight(settings) -> None:
    """What ``gnn-faas up --platform docker`` checks before anything starts: the
    engine of ``settings`` (:class:`~gnn_faas.config.DockerSettings`) answers
    and holds both function images. Raises a
    :class:`~gnn_faas.errors.GnnFaasError` naming the cause."""
    docker = _docker()
    where = settings.host or os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        client = (
            docker.DockerClient(base_url=settings.host, timeout=10)
            if settings.host
            else docker.from_env(timeout=10)
        )
        client.ping()
    except Exception as exc:
        raise Unavailable(
            f"no Docker engine answers at {where} ({type(exc).__name__}: {exc}); start one "
            "(`make images` starts one under build/docker) or set DOCKER_HOST"
        ) from None
    try:
        missing = []
        for image in dict.fromkeys((settings.memory_image, settings.compute_image)):
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                missing.append(image)
        if missing:
            raise NotFound(
                f"image(s) {', '.join(missing)} not found in the Docker engine at {where}; "
                "build them with `make images`"
            )
    finally:
        client.close()


def check_mounts(serving) -> None:
    """The store (``file://``) and every model's checkpoint, which the containers
    bind-mount, are readable by the containers' user."""
    store = serving.store
    if store.startswith("file://"):
        path = Path(store[len("file://") :].split("?", 1)[0]).resolve()
        check_readable(str(path), "the store")
    for m in serving.models:
        ckpt = Path(serving.checkpoint_dir(m)).resolve()
        check_readable(str(ckpt), f"model {m.name!r}'s checkpoint")

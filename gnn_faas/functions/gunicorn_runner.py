"""Run a Flask app factory under gunicorn, programmatically.

The factory is called in each *worker*, never in the master (no ``preload_app``):
a compute worker initialises torch (and CUDA, which does not survive a fork) in its
own process, and the master stays a small supervisor. Workers are
:class:`~gnn_faas.functions.buffered_worker.BufferedWorker` (``ServerConfig.front``
sets its limits; ``worker_class="gthread"`` gives stock gunicorn, the baseline of
``gnn-faas bench slowclients``). A ``post_fork`` callback runs in the worker before
the factory (the compute function sets its torch threads there).

When the sockets are bound the master prints one line, ``gnn-faas <role> function
listening on http://HOST:PORT (pid N)``, with the real port (``port=0`` picks a free
one): what the local platform waits for. SIGTERM is a graceful shutdown. Every line
the server writes is a JSON object (:mod:`gnn_faas.logs`).

With ``GNN_FAAS_EXIT_ON_WORKER_DEATH=1`` (set in the images) a worker that dies (the
OOM killer, a crash) ends the master with :data:`WORKER_DEATH_EXIT` instead of a
silent respawn, so the container exits and its platform counts the failure. An app
that fails to start (a :class:`~gnn_faas.errors.GnnFaasError`) prints one line, the
worker exits with :data:`BOOT_ERROR_EXIT` and :func:`serve` returns 2. An instance
with an owner lease (``GNN_FAAS_OWNER_LEASE``) stops itself (SIGTERM) once the lease
lapses: its gateway is gone (gnn_faas/owner_lease.py).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gunicorn.app.base import BaseApplication

from gnn_faas.functions.buffered_worker import FrontSettings, configure
from gnn_faas.logs import ensure_logging, json_line

BOOT_ERROR_EXIT = 3  # gunicorn's WORKER_BOOT_ERROR: the arbiter halts with it
WORKER_DEATH_EXIT = 137  # 128 + SIGKILL: what an OOM-killed container reports


@dataclass(frozen=True)
class ServerConfig:
    role: str  # "memory" or "compute" (for the log line and process titles)
    host: str = "127.0.0.1"
    port: int = 0
    workers: int = 1
    threads: int = 4
    timeout: int = 120  # seconds a worker may stay silent on one request
    graceful_timeout: int = 10
    keepalive: int = 30  # keep connections to the gateway open between calls
    loglevel: str = "warning"
    worker_class: str = "gnn_faas.functions.buffered_worker.BufferedWorker"
    front: FrontSettings = field(default_factory=FrontSettings)
    extra: dict[str, Any] = field(default_factory=dict)  # any other gunicorn setting


class FactoryApplication(BaseApplication):
    """gunicorn application whose WSGI app comes from ``factory()`` in the worker."""

    def __init__(
        self,
        factory: Callable[[], Any],
        config: ServerConfig,
        post_fork: Callable[[Any, Any], None] | None = None,
        out=None,
    ):
        self.factory = factory
        self.server_config = config
        self.post_fork_hook = post_fork
        self.out = out or sys.stdout
        super().__init__()

    def load_config(self) -> None:
        c = self.server_config
        front = c.front
        configure(front)  # in the master: the workers fork with it
        raise_fd_limit(front.max_connections + 256)
        settings = {
            "bind": [f"{c.host}:{c.port}"],
            "workers": c.workers,
            "worker_class": c.worker_class,
            "threads": c.threads,
            "worker_connections": front.max_connections + c.threads,
            "timeout": c.timeout,
            "graceful_timeout": c.graceful_timeout,
            "keepalive": c.keepalive,
            "loglevel": c.loglevel,
            "preload_app": False,
            # JSON lines (gnn_faas/logs.py); GNN_FAAS_ACCESS_LOG=0 turns the access log off
            "logger_class": "gnn_faas.logs.GunicornJsonLogger",
            "accesslog": None if os.environ.get("GNN_FAAS_ACCESS_LOG") == "0" else "-",
            "proc_name": f"gnn-faas-{c.role}",
            "control_socket_disable": True,
            "when_ready": self._when_ready,
            "post_fork": self._post_fork,
            **self._worker_death_hook(),
            **c.extra,
        }
        for key, value in settings.items():
            if key in self.cfg.settings:  # older gunicorns lack some settings
                self.cfg.set(key, value)

    def load(self):
        from gnn_faas.errors import GnnFaasError
        from gnn_faas.http import wsgi_app

        try:  # a function's frame endpoints skip Flask (gnn_faas/http.py, FrameDispatcher)
            app = wsgi_app(self.factory())
        except GnnFaasError as exc:
            msg = f"gnn-faas {self.server_config.role} function: error: {exc}"
            print(json_line("gnn_faas.server", msg, "error"), file=sys.stderr)
            sys.stderr.flush()
            raise SystemExit(BOOT_ERROR_EXIT) from None
        freeze_startup_objects()
        return app

    # -- hooks ---------------------------------------------------------------------
    def _when_ready(self, server) -> None:
        # the master of a function instance ends itself once its gateway's lease lapses
        from gnn_faas.owner_lease import watch_from_env

        watch_from_env()
        for listener in server.LISTENERS:
            host, port = listener.sock.getsockname()[:2]
            url = f"http://{host}:{port}"
            msg = (
                f"gnn-faas {self.server_config.role} function listening on {url} (pid {server.pid})"
            )
            print(
                json_line("gnn_faas.server", msg, url=url, pid=server.pid),
                file=self.out,
                flush=True,
            )

    @staticmethod
    def _worker_death_hook() -> dict[str, Any]:
        if os.environ.get("GNN_FAAS_EXIT_ON_WORKER_DEATH", "") in ("", "0"):
            return {}

        def child_exit(server, worker) -> None:
            # the arbiter empties LISTENERS when it stops: a worker leaving then is a shutdown
            if server.LISTENERS:
                msg = f"gnn-faas: worker {worker.pid} died; the instance exits with it"
                print(json_line("gnn_faas.server", msg, "error"), file=sys.stderr, flush=True)
                os._exit(WORKER_DEATH_EXIT)

        return {"child_exit": child_exit}

    def _post_fork(self, server, worker) -> None:
        # a worker dies with its master, even a SIGKILLed one (no orphans)
        from gnn_faas.parent_death import (
            fix_mmap_threshold,
            limit_malloc_arenas,
            set_parent_death_signal,
        )

        set_parent_death_signal(signal.SIGTERM)
        if self.server_config.front.trim_after_bytes:
            # large bodies in their own mappings, unmapped when freed (see fix_mmap_threshold)
            fix_mmap_threshold(1 << 20)
        if self.server_config.role != "gateway":
            # a function's few threads x varying buffers: bounded fragmentation (the
            # gateway's many threads would contend for two arenas)
            limit_malloc_arenas(2)
        if self.post_fork_hook is not None:
            self.post_fork_hook(server, worker)


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, torch, the app and what it loaded)
    out of the collector's reach (``gc.freeze``): they live as long as the
    process, yet each full collection would walk them all, pausing every thread
    for tens of milliseconds (a request's tail latency) as the requests' own
    allocations trigger one. Collected first, so no garbage is kept."""
    gc.collect()
    gc.freeze()


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards ``wanted`` (at most the
    hard limit; the workers inherit it): each connection is a descriptor."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def serve(
    factory: Callable[[], Any],
    config: ServerConfig,
    post_fork: Callable[[Any, Any], None] | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status: 0 on a clean shutdown,
    2 when the app could not start (the CLI's code for a :class:`GnnFaasError`)."""
    ensure_logging()  # JSON lines from the gnn_faas loggers unless the caller set them up
    master = os.getpid()
    try:
        FactoryApplication(factory, config, post_fork).run()
    except SystemExit as exc:
        if os.getpid() != master:
            raise  # a worker leaving: its exit code is for the arbiter
        code = exc.code
        if code == BOOT_ERROR_EXIT:
            return 2
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0

"""An owner lease: function instances end themselves when their gateway is gone.

A platform that starts instances (local processes, docker containers) holds a
lease file and renews it (its mtime) every ``renew_s`` from a daemon thread of
the owning process. Each instance is told the file and a timeout through the
environment (:data:`LEASE_ENV`, :data:`TIMEOUT_ENV`); a watchdog thread in the
instance's server master (:func:`watch_from_env`) checks it every
``timeout / 4`` seconds and, when the file has not been renewed for ``timeout``
seconds or is gone, sends its own process SIGTERM (a graceful stop: the
container exits, the process ends). So an instance outlives a dead gateway
(SIGKILL, OOM kill, a crashed node agent) by at most ``timeout + timeout / 4``
seconds, even when no new gateway starts and nothing reaps it.

Why a file and not the owner's pid: a container has its own pid namespace and
cannot see the gateway's process; a file bind-mounted read-only into the
container (the platform mounts the lease's directory) shows the renewals of
the host, since both read the same kernel clock. A gateway that stops cleanly
removes the file: its instances, if any were left, end too.

Defaults: renewed every 5 s, expired after 30 s (an instance ends within
about 38 s of its gateway, under the one minute the platforms promise).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("gnn_faas.platform.lease")

LEASE_ENV = "GNN_FAAS_OWNER_LEASE"
TIMEOUT_ENV = "GNN_FAAS_OWNER_LEASE_TIMEOUT_S"
DEFAULT_RENEW_S = 5.0
DEFAULT_TIMEOUT_S = 30.0


class OwnerLease:
    """The owner's side: a lease file in a fresh directory, renewed by a thread."""

    def __init__(
        self,
        renew_s: float = DEFAULT_RENEW_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        parent: str | Path | None = None,
    ):
        if not 0 < renew_s < timeout_s:
            raise ValueError("a lease must be renewed more often than it expires")
        self.renew_s, self.timeout_s = float(renew_s), float(timeout_s)
        # world-readable (0755 / 0644): a container's user reads it through a bind mount
        self.dir = Path(tempfile.mkdtemp(prefix="gnn-faas-lease-", dir=parent))
        os.chmod(self.dir, 0o755)
        self.path = self.dir / "lease"
        self.path.write_text(f"{os.getpid()}\n")
        os.chmod(self.path, 0o644)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="gnn-faas-lease", daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        """What an instance needs to watch this lease."""
        return {LEASE_ENV: str(self.path), TIMEOUT_ENV: f"{self.timeout_s:g}"}

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                os.utime(self.path)
            except OSError as exc:
                log.warning("cannot renew the owner lease %s: %s", self.path, exc)

    def close(self) -> None:
        """Stop renewing and remove the lease (instances still running end)."""
        self._stop.set()
        shutil.rmtree(self.dir, ignore_errors=True)


def expired(path: str | Path, timeout_s: float, now: float | None = None) -> bool:
    """Whether the lease at ``path`` is gone or older than ``timeout_s``."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return True
    return (time.time() if now is None else now) - mtime > timeout_s


def watch(path: str | Path, timeout_s: float, on_expiry=None) -> threading.Thread:
    """A daemon thread that calls ``on_expiry`` (default: SIGTERM to this process)
    once the lease has expired, checking every ``timeout_s / 4``."""

    def stop_self() -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    action = on_expiry or stop_self

    def loop() -> None:
        while True:
            time.sleep(max(0.05, timeout_s / 4))
            if expired(path, timeout_s):
                print(
                    f"gnn-faas: the owner's lease {path} expired (no renewal for "
                    f"{timeout_s:g} s): the gateway is gone; stopping",
                    flush=True,
                )
                action()
                return

    t = threading.Thread(target=loop, name="gnn-faas-lease-watch", daemon=True)
    t.start()
    return t


def watch_from_env(environ=os.environ) -> threading.Thread | None:
    """Start :func:`watch` when the environment names a lease; else nothing."""
    path = environ.get(LEASE_ENV)
    if not path:
        return None
    try:
        timeout_s = float(environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        timeout_s = DEFAULT_TIMEOUT_S
    return watch(path, timeout_s)

"""Platforms that run their instances themselves: the instance table that the
local (processes) and docker (containers) platforms share.

A :class:`ManagedPlatform` owns the table of running instances (``id ->``
:class:`Running`), the lock that guards it, the :class:`Meter`, the id
counter, ``busy`` (calls in flight), keep-alive reaping (scale to zero), the
reaper thread, ``metering`` and ``shutdown``. A backend starts an instance,
puts it in the table with :meth:`ManagedPlatform._register`, waits until it
answers and calls :meth:`ManagedPlatform._mark_ready`; it overrides the hooks
that touch the instances themselves:

- :meth:`~ManagedPlatform._exited`: which live instances have exited, and why;
- :meth:`~ManagedPlatform._terminate`: stop one instance within a grace period;
- :meth:`~ManagedPlatform._terminate_all`: stop many at once (one grace period);
- :meth:`~ManagedPlatform._on_failure` / :meth:`~ManagedPlatform._drop_failed`:
  the backend's extra when an instance fails / when a failed one leaves the table;
- :meth:`~ManagedPlatform._close`: release what the backend holds at shutdown.

Keep-alive: :meth:`ManagedPlatform.reap` stops instances ``ready`` with no call
in flight for longer than their spec's ``keep_alive_s`` (``now - last_used >
keep_alive_s``, platform clock) and drops failed ones. Times come from
``clock``; a :class:`~gnn_faas.clock.FakeClock` makes keep-alive and metering
deterministic.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gnn_faas.clock import Clock, RealClock
from gnn_faas.errors import NotFound, Unavailable
from gnn_faas.scheduler.platform.base import FunctionSpec, Instance, Platform
from gnn_faas.scheduler.platform.metering import Meter, MeteringReport

log = logging.getLogger(__name__)


class Tracked(Protocol):
    """A table entry whose calls in flight :func:`track_call` counts."""

    instance: Instance
    calls: int


def snapshots(entries: Iterable[Tracked], name: str | None = None) -> list[Instance]:
    """Copies of the entries' instances (of function ``name``); call under the
    table's lock."""
    return [replace(e.instance) for e in entries if name is None or e.instance.spec.name == name]


@contextlib.contextmanager
def track_call(
    lock: threading.RLock,
    clock: Clock,
    meter: Meter,
    lookup: Callable[[], tuple[Tracked, str | None]],
) -> Iterator[Instance]:
    """The ``busy`` of every platform: ``lookup()`` (run under ``lock``) finds
    the entry, or raises :class:`NotFound` / :class:`Unavailable`, and names
    its meter key (``None``: not metered). While the ``with`` body runs the
    entry counts one more call and is ``busy``; after it, ``last_used`` is
    the platform clock's now (keep-alive) and the last call out makes it
    ``ready`` again. The meter bills busy time from begin to end."""
    with lock:
        entry, key = lookup()
        entry.calls += 1
        entry.instance.state = "busy"
        snapshot = replace(entry.instance)
    if key is not None:
        meter.busy_begin(key)
    try:
        yield snapshot
    finally:
        with lock:
            entry.calls -= 1
            entry.instance.last_used = clock.now()
            if entry.calls == 0 and entry.instance.state == "busy":
                entry.instance.state = "ready"
        if key is not None:
            meter.busy_end(key)


@dataclass
class Running:
    """One instance in the table: its snapshot source, the backend's handle
    (a :class:`subprocess.Popen`, a container id) and its calls in flight."""

    instance: Instance
    handle: Any
    calls: int = 0


class ManagedPlatform(Platform):
    """The instance table of a platform that starts and stops its instances."""

    reaper_name = "gnn-faas-reaper"

    def __init__(self, clock: Clock | None = None, stop_grace_s: float = 5.0):
        """Sets up the table; a subclass calls :meth:`_start_reaper` once it is
        ready to run (it also registers :meth:`shutdown` with :mod:`atexit`)."""
        self.clock = clock if clock is not None else RealClock()
        self.stop_grace_s = float(stop_grace_s)
        self.meter = Meter(self.clock)
        self._running: dict[str, Running] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._closed = False
        self._stop_reaper = threading.Event()
        self._reaper: threading.Thread | None = None

    def _start_reaper(self, interval_s: float | None) -> None:
        """A daemon thread calling :meth:`reap` every ``interval_s`` (``None``:
        none; call :meth:`reap` yourself); :meth:`shutdown` runs at exit."""
        if interval_s is not None:
            self._reaper = threading.Thread(
                target=self._reap_loop,
                args=(float(interval_s),),
                daemon=True,
                name=self.reaper_name,
            )
            self._reaper.start()
        atexit.register(self.shutdown)

    # -- hooks -------------------------------------------------------------------------
    @abstractmethod
    def _exited(self, live: dict[str, Running], force: bool) -> dict[str, str]:
        """Of the ``live`` instances (not stopped or failed), those whose process
        or container has exited: ``{id: reason}``. ``force``: ask the backend
        now even if a backend rate-limits its polls."""

    @abstractmethod
    def _terminate(self, run: Running, grace: float, *, count_exit: bool = False) -> None:
        """Stop one instance: SIGTERM, wait up to ``grace`` seconds (0: kill
        now), SIGKILL what is left, and release all it holds (no zombies, no
        port, no container). ``count_exit``: it was live when asked to stop; a
        backend that counts failures counts it if it had exited already."""

    def _terminate_all(self, runs: list[tuple[str, Running]], grace: float) -> None:
        """Stop many instances in one grace period, not one each (default: every
        :meth:`_terminate` at once on a thread pool)."""
        if runs:
            with ThreadPoolExecutor(max_workers=min(16, len(runs))) as pool:
                list(pool.map(lambda r: self._terminate(r[1], grace), runs))

    def _on_failure(self, run: Running, reason: str) -> None:
        """An instance was just marked ``failed`` by :meth:`_poll` (``reason``
        from :meth:`_exited`): the backend's extra (default: nothing)."""

    def _drop_failed(self, run: Running) -> None:
        """A failed instance leaves the table in :meth:`reap`: the backend's
        extra, such as removing its container (default: nothing)."""

    def _close(self) -> None:
        """At the end of :meth:`shutdown`, after every instance stopped: release
        the backend's own resources (default: nothing)."""

    # -- the table -----------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(f"the {self.name} platform has been shut down")

    def _new_id(self, spec: FunctionSpec) -> str:
        return f"{spec.name}-{next(self._ids)}"

    def _register(
        self, iid: str, spec: FunctionSpec, handle: Any, *, url: str, pid: int | None, at: float
    ) -> Running:
        """Put a just-started instance (``starting``, started at ``at``) in the
        table and start billing it."""
        inst = Instance(
            id=iid, spec=spec, url=url, pid=pid, state="starting", started_at=at, last_used=at
        )
        run = Running(inst, handle)
        with self._lock:
            self._running[iid] = run
        self.meter.start(iid, spec.name, spec.memory_mb, spec.vcpus, at=at)
        return run

    def _mark_ready(
        self, run: Running, cold_start_s: float, *, url: str | None = None, pid: int | None = None
    ) -> Instance:
        """The instance answered its readiness probe after ``cold_start_s``
        seconds (wall time): ``ready`` (unless it failed meanwhile), now
        ``last_used``; its snapshot."""
        inst = run.instance
        with self._lock:
            now = self.clock.now()
            inst.ready_at, inst.last_used, inst.cold_start_s = now, now, cold_start_s
            if url is not None:
                inst.url = url
            if pid is not None:
                inst.pid = pid
            if inst.state == "starting":
                inst.state = "ready"
            snapshot = replace(inst)
        self.meter.ready(inst.id, cold_start_s)
        log.info("%s ready at %s after a %.3f s cold start", inst.id, inst.url, cold_start_s)
        return snapshot

    def _poll(self, force: bool = False) -> None:
        """Mark instances that exited as ``failed`` and stop billing them."""
        with self._lock:
            live = {
                iid: r
                for iid, r in self._running.items()
                if r.instance.state not in ("stopped", "failed")
            }
        if not live:
            return
        for iid, reason in self._exited(live, force).items():
            with self._lock:
                run = self._running.get(iid)
                if run is not live[iid] or run.instance.state in ("stopped", "failed"):
                    continue
                run.instance.state = "failed"
            log.warning("instance %s failed (%s)", iid, reason)
            self.meter.stop(iid)
            self._on_failure(run, reason)

    def _finish(self, instance_id: str, run: Running, *, count_exit: bool = False) -> None:
        self._terminate(run, self.stop_grace_s, count_exit=count_exit)
        self.meter.stop(instance_id)
        log.info("stopped %s", instance_id)

    # -- the Platform interface ------------------------------------------------------------
    def stop(self, instance_id: str) -> None:
        with self._lock:
            run = self._running.pop(instance_id, None)
            if run is None:
                return
            was_failed = run.instance.state == "failed"
            if not was_failed:
                run.instance.state = "stopped"
        self._finish(instance_id, run, count_exit=not was_failed)

    def instances(self, name: str | None = None) -> list[Instance]:
        self._poll()
        with self._lock:
            return snapshots(self._running.values(), name)

    def busy(self, instance_id: str) -> contextlib.AbstractContextManager[Instance]:
        def lookup() -> tuple[Running, str]:
            run = self._running.get(instance_id)
            if run is None:
                raise NotFound(f"no instance {instance_id!r}")
            if not run.instance.available:
                raise Unavailable(f"instance {instance_id} is {run.instance.state}")
            return run, instance_id

        return track_call(self._lock, self.clock, self.meter, lookup)

    def reap(self) -> list[str]:
        self._poll(force=True)
        now = self.clock.now()
        with self._lock:
            failed = [i for i, r in self._running.items() if r.instance.state == "failed"]
            idle = [
                i
                for i, r in self._running.items()
                if r.instance.state == "ready"
                and r.calls == 0
                and now - r.instance.last_used > r.instance.spec.keep_alive_s
            ]
            # Out of the table under the lock: no call can be routed to them now.
            gone = [self._running.pop(iid) for iid in failed]
            to_stop = [(iid, self._running.pop(iid)) for iid in idle]
            for _, run in to_stop:
                run.instance.state = "stopped"
        for run in gone:
            self._drop_failed(run)
        for iid, run in to_stop:
            log.info("%s idle past its keep-alive: scaling it in", iid)
            self._finish(iid, run)
        return failed + idle

    def _reap_loop(self, interval: float) -> None:
        while not self._stop_reaper.wait(interval):
            try:
                self.reap()
            except Exception:  # never let the reaper die silently
                log.exception("reaper failed")

    def metering(self, start: float | None = None, end: float | None = None) -> MeteringReport:
        self._poll()
        return self.meter.report(start, end)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop_reaper.set()
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=10)
        with self._lock:
            runs = list(self._running.items())
            self._running.clear()
        self._terminate_all(runs, self.stop_grace_s)
        for iid, _ in runs:
            self.meter.stop(iid)
        self._close()
        with contextlib.suppress(Exception):
            atexit.unregister(self.shutdown)

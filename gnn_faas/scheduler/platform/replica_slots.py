"""Platforms whose replicas another system owns (Knative, OpenFaaS): the gateway
holds *dispatch slots* on the replicas it observes.

On Knative or OpenFaaS the gateway neither starts nor addresses pods: it calls the
function's URL and the platform's router picks a replica. What it still decides is
how many calls it lets through, so here an
:class:`~gnn_faas.scheduler.platform.base.Instance` is a **slot**: one call in
flight on one observed ready replica. A replica of concurrency ``c`` holds at most
``c`` slots::

    slots(f) <= ready_replicas(f) * c(f)

:meth:`launch` (the pool's launch rule, docs/design/launch-and-reap.md) binds a
slot to the ready replica with the fewest slots; when every ready replica is full
it calls :meth:`want_replicas` (Knative: nothing, the autoscaler sees the
saturation; OpenFaaS with gateway scaling: ``/system/scale-function``) and waits
until a ready replica appears or ``start_timeout_s`` passes (``Unavailable``). A
slot whose replica disappeared is ``failed``.

Subclasses implement one hook, :meth:`observe`, reading the platform's API into a
:class:`FunctionView`; an API that is unreachable or refuses keeps the last view,
logged once per change and shown in :meth:`replicas`. A replica is billed at its
function's requested resources from its creation (or first sight) to its
disappearance; busy time from the slots' calls.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from abc import abstractmethod
from dataclasses import dataclass, field, replace

from gnn_faas.clock import Clock, RealClock
from gnn_faas.errors import GnnFaasError, NotFound, Unavailable
from gnn_faas.scheduler.platform.base import FunctionSpec, Instance, Platform
from gnn_faas.scheduler.platform.managed import snapshots, track_call
from gnn_faas.scheduler.platform.metering import Meter, MeteringReport

log = logging.getLogger(__name__)


class PlatformAPIError(Unavailable):
    """The platform's API is unreachable, refused the credentials, forbids an
    action or answered an error: the message says which and what to fix."""


@dataclass
class Replica:
    """One replica (pod) as observed. Wall-clock seconds (``time.time()``)."""

    id: str
    ready: bool
    created_at: float | None = None
    ready_at: float | None = None


@dataclass
class FunctionView:
    """What the platform says about one function."""

    resource: str  # the platform's name of it (Knative Service, OpenFaaS function)
    url: str | None
    ready: bool
    replicas: list[Replica] = field(default_factory=list)
    desired: int | None = None
    actual: int | None = None
    revision: str | None = None
    concurrency: int = 1
    memory_mb: float | None = None
    vcpus: float | None = None


@dataclass
class _Slot:
    instance: Instance
    replica: str
    calls: int = 0


@dataclass
class _Function:
    spec: FunctionSpec
    view: FunctionView | None = None
    error: str | None = None
    refreshed: float = float("-inf")
    metered: set[str] = field(default_factory=set)


class ReplicaSlotPlatform(Platform):
    """Slots on replicas another system scales; subclasses read its API."""

    name = "replica-slots"
    addresses_instances = False  # every slot calls the function's one URL

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        refresh_s: float = 1.0,
        start_timeout_s: float = 60.0,
        poll_s: float = 0.2,
    ):
        self.clock = clock if clock is not None else RealClock()
        self.refresh_s = float(refresh_s)
        self.start_timeout_s = float(start_timeout_s)
        self.poll_s = float(poll_s)
        self.meter = Meter(self.clock)
        self._functions: dict[str, _Function] = {}
        self._slots: dict[str, _Slot] = {}
        self._launching: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._closed = False

    # -- the hook ----------------------------------------------------------------
    @abstractmethod
    def observe(self, spec: FunctionSpec) -> FunctionView:
        """Read the platform's view of ``spec``'s function. Raise
        :class:`PlatformAPIError` (or :class:`NotFound`) with a clear message."""

    def want_replicas(self, spec: FunctionSpec, view: FunctionView, slots: int) -> None:
        """Every ready replica is full and the gateway wants ``slots`` slots:
        ask the platform for more replicas, if it takes requests (default: no)."""

    def release_replicas(self, spec: FunctionSpec, view: FunctionView, slots: int) -> None:
        """The gateway holds ``slots`` slots after a release (default: no-op)."""

    # -- observation -----------------------------------------------------------------
    def _function(self, spec: FunctionSpec) -> _Function:
        with self._lock:
            fn = self._functions.get(spec.name)
            if fn is None:
                fn = self._functions[spec.name] = _Function(spec)
            return fn

    def refresh(self, spec: FunctionSpec, force: bool = False) -> _Function:
        """Observe the function if its view is older than ``refresh_s``; an
        error keeps the previous view and is recorded (logged once per change)."""
        fn = self._function(spec)
        now = time.monotonic()
        if not force and now - fn.refreshed < self.refresh_s:
            return fn
        fn.refreshed = now
        try:
            view = self.observe(spec)
        except (GnnFaasError, OSError) as exc:
            msg = str(exc)
            if msg != fn.error:
                log.error("%s platform, function %s: %s", self.name, spec.name, msg)
            fn.error = msg
            return fn
        if fn.error is not None:
            log.info("%s platform, function %s: the API answers again", self.name, spec.name)
        with self._lock:
            fn.view, fn.error = view, None
            self._meter_replicas(fn)
        return fn

    def _meter_replicas(self, fn: _Function) -> None:
        """Bill replicas from creation (or first sight) until they disappear."""
        view = fn.view
        assert view is not None
        mem = view.memory_mb or fn.spec.memory_mb
        cpu = view.vcpus or fn.spec.vcpus
        wall, mono = time.time(), self.clock.now()
        seen = set()
        for r in view.replicas:
            key = f"{fn.spec.name}/{r.id}"
            seen.add(key)
            if key in fn.metered:
                continue
            created = mono - max(0.0, wall - r.created_at) if r.created_at else mono
            self.meter.start(key, fn.spec.name, mem, cpu, at=created)
            fn.metered.add(key)
            if r.ready and r.created_at and r.ready_at:
                self.meter.ready(key, max(0.0, r.ready_at - r.created_at))
        for key in fn.metered - seen:
            self.meter.stop(key)
        fn.metered &= seen

    # -- slots -------------------------------------------------------------------------
    def _free_replica(self, fn: _Function) -> Replica | None:
        """The ready replica with the fewest slots below its concurrency."""
        view = fn.view
        if view is None or not view.url:
            return None
        held: dict[str, int] = {}
        for s in self._slots.values():
            if s.instance.spec.name == fn.spec.name and s.instance.state != "failed":
                held[s.replica] = held.get(s.replica, 0) + 1
        free = [r for r in view.replicas if r.ready and held.get(r.id, 0) < view.concurrency]
        return min(free, key=lambda r: (held.get(r.id, 0), r.id), default=None)

    def _held(self, name: str) -> int:
        return sum(
            1
            for s in self._slots.values()
            if s.instance.spec.name == name and s.instance.state != "failed"
        )

    def launch(self, spec: FunctionSpec) -> Instance:
        if self._closed:
            raise Unavailable(f"the {self.name} platform has been shut down")
        t0 = time.perf_counter()
        deadline = t0 + self.start_timeout_s
        asked = False
        with self._lock:
            self._launching[spec.name] = self._launching.get(spec.name, 0) + 1
        try:
            while True:
                fn = self.refresh(spec, force=asked)
                with self._lock:
                    replica = self._free_replica(fn)
                    if replica is not None:
                        return self._bind(fn, replica, time.perf_counter() - t0)
                    # slots held plus every launch waiting, this one included
                    wanted = self._held(spec.name) + self._launching[spec.name]
                if fn.view is not None and not asked:
                    self.want_replicas(spec, fn.view, wanted)
                    asked = True
                if time.perf_counter() >= deadline or self._closed:
                    error = PlatformAPIError if fn.error else Unavailable
                    raise error(self._no_slot_reason(fn))
                time.sleep(self.poll_s)
        finally:
            with self._lock:
                self._launching[spec.name] -= 1

    def _no_slot_reason(self, fn: _Function) -> str:
        if fn.error:
            return f"{fn.spec.name}: {fn.error}"
        v = fn.view
        if v is None:
            return f"{fn.spec.name}: not observed yet"
        ready = sum(r.ready for r in v.replicas)
        return (
            f"{fn.spec.name} ({v.resource}): no free ready replica after "
            f"{self.start_timeout_s:g} s (ready {ready}, desired {v.desired}, "
            f"actual {v.actual}, {self._held(fn.spec.name)} slots held, "
            f"concurrency {v.concurrency}{'' if v.ready else ', not ready'})"
        )

    def _bind(self, fn: _Function, replica: Replica, waited: float) -> Instance:
        assert fn.view is not None and fn.view.url
        now = self.clock.now()
        sid = f"{fn.spec.name}/{replica.id}/{next(self._ids)}"
        inst = Instance(
            id=sid,
            spec=fn.spec,
            url=fn.view.url.rstrip("/"),
            pid=None,
            state="ready",
            started_at=now,
            ready_at=now,
            last_used=now,
            cold_start_s=waited,
        )
        self._slots[sid] = _Slot(inst, replica.id)
        log.info("%s: slot %s on replica %s (%s)", self.name, sid, replica.id, inst.url)
        return replace(inst)

    def _mark_failed(self) -> None:
        """Slots whose replica is gone or no longer ready fail (the data plane
        drops them once idle)."""
        with self._lock:
            for s in self._slots.values():
                fn = self._functions.get(s.instance.spec.name)
                if fn is None or fn.view is None or s.instance.state == "failed":
                    continue
                alive = {r.id for r in fn.view.replicas if r.ready}
                if s.replica not in alive:
                    s.instance.state = "failed"

    def stop(self, instance_id: str) -> None:
        with self._lock:
            slot = self._slots.pop(instance_id, None)
            if slot is None:
                return
            fn = self._functions.get(slot.instance.spec.name)
            held = self._held(slot.instance.spec.name)
        if fn is not None and fn.view is not None:
            self.release_replicas(fn.spec, fn.view, held)

    def instances(self, name: str | None = None) -> list[Instance]:
        with self._lock:
            fns = [f for n, f in self._functions.items() if name is None or n == name]
        for fn in fns:
            self.refresh(fn.spec)
        self._mark_failed()
        with self._lock:
            return snapshots(self._slots.values(), name)

    def busy(self, instance_id: str) -> contextlib.AbstractContextManager[Instance]:
        """Busy time is billed to the slot's replica while the gateway meters it."""

        def lookup() -> tuple[_Slot, str | None]:
            slot = self._slots.get(instance_id)
            if slot is None:
                raise NotFound(f"no slot {instance_id!r}")
            if slot.instance.state == "failed":
                raise Unavailable(f"replica {slot.replica} of slot {instance_id} is gone")
            key = f"{slot.instance.spec.name}/{slot.replica}"
            return slot, key if key in self._functions[slot.instance.spec.name].metered else None

        return track_call(self._lock, self.clock, self.meter, lookup)

    def reap(self) -> list[str]:
        """Drop failed slots with no call in flight (Knative and OpenFaaS scale
        the replicas themselves)."""
        self._mark_failed()
        with self._lock:
            gone = [
                i for i, s in self._slots.items() if s.instance.state == "failed" and not s.calls
            ]
            for i in gone:
                del self._slots[i]
        return gone

    # -- reporting -----------------------------------------------------------------------
    def replicas(self, name: str) -> dict:
        """``{desired, actual, ready, revision, url, slots, in_flight, error}``
        of function ``name`` as last observed (``gnn-faas status``)."""
        with self._lock:
            fn = self._functions.get(name)
            slots = [s for s in self._slots.values() if s.instance.spec.name == name]
            in_flight = sum(s.calls for s in slots)
        if fn is None:
            return {"function": name, "error": "not observed yet"}
        self.refresh(fn.spec)
        v = fn.view
        return {
            "function": name,
            "resource": v.resource if v else None,
            "desired": v.desired if v else None,
            "actual": v.actual if v else None,
            "ready": sum(r.ready for r in v.replicas) if v else 0,
            "revision": v.revision if v else None,
            "url": v.url if v else None,
            "concurrency": v.concurrency if v else None,
            "slots": len(slots),
            "in_flight": in_flight,
            "error": fn.error,
        }

    def metering(self, start: float | None = None, end: float | None = None) -> MeteringReport:
        return self.meter.report(start, end)

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._slots.clear()
            keys = [k for f in self._functions.values() for k in f.metered]
        # the replicas live on; this gateway stops observing (and billing) them
        for k in keys:
            self.meter.stop(k)

"""Metering: what function instances cost, as serverless platforms bill it.

For an instance with memory ``m`` MiB and ``v`` vCPUs, alive (spawned, not yet
stopped) for ``A`` seconds of a window and busy (at least one call in flight)
for ``B`` of them::

    allocated_gb_s = m / 1024 · A        busy_gb_s   = m / 1024 · B
    vcpu_s         = v · A               busy_vcpu_s = v · B

Alive time starts at the spawn, so cold starts are paid for (Kubernetes
reserves a pod's resources from its creation; AWS Lambda bills the init
phase). Busy time is the union of call intervals: overlapping calls on one
instance share its memory, so they are not double counted. ``cold_starts``
counts instances spawned within the window and ``cold_start_s_total`` their
measured spawn-to-ready seconds. Figures are reported per instance, per
function name and in total (docs/architecture.md, principle 6: benchmarks read these rather
than recompute them). All times come from the platform's clock, so a
:class:`~gnn_faas.clock.FakeClock` makes reports exact in tests.

Memory stays bounded however long the platform serves: an instance's busy
intervals live in two float arrays, and intervals that ended more than
``retention_s`` (default 300 s) ago are folded into one total (their seconds
and the span they covered). A report whose window covers the folded span
(every default report, and any window within the last ``retention_s``) is
exact; a window cutting through it gets the folded seconds pro rata.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field

import numpy as np

from gnn_faas.clock import Clock


@dataclass
class Usage:
    allocated_gb_s: float = 0.0
    busy_gb_s: float = 0.0
    vcpu_s: float = 0.0
    busy_vcpu_s: float = 0.0
    alive_s: float = 0.0
    busy_s: float = 0.0
    cold_starts: int = 0
    cold_start_s_total: float = 0.0
    instances: int = 0

    def add(self, other: Usage) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def __getitem__(self, key: str) -> float | int:
        """``usage["busy_gb_s"]``: figures by name, as in :meth:`as_dict`."""
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class MeteringReport:
    """Usage within ``[start, end]``: ``total``, ``functions[name]`` (also
    :meth:`by_function`) and ``instances[id]`` (instances alive at some point
    of the window)."""

    start: float
    end: float
    total: Usage = field(default_factory=Usage)
    functions: dict[str, Usage] = field(default_factory=dict)
    instances: dict[str, Usage] = field(default_factory=dict)

    def by_function(self) -> dict[str, Usage]:
        """Usage per function name."""
        return self.functions

    def as_dict(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "total": self.total.as_dict(),
            "by_function": {k: v.as_dict() for k, v in sorted(self.functions.items())},
            "instances": {k: v.as_dict() for k, v in sorted(self.instances.items())},
        }


@dataclass
class _Record:
    name: str
    memory_mb: float
    vcpus: float
    started_at: float
    stopped_at: float | None = None
    cold_start_s: float | None = None
    busy: BusyIntervals = field(default_factory=lambda: BusyIntervals())
    depth: int = 0  # calls in flight


class BusyIntervals:
    """Disjoint busy intervals ``[begin, end)`` in time order (``end = inf`` while
    open); those ending before a horizon are folded into a total."""

    def __init__(self, capacity: int = 64):
        self.begin = np.empty(capacity)
        self.end = np.empty(capacity)
        self.n = 0
        self.folded_s = 0.0
        self.folded_lo = math.inf  # span of the folded intervals
        self.folded_hi = -math.inf

    def open(self, t: float, horizon: float) -> None:
        if self.n == self.begin.size:
            self.fold(horizon)
            if self.n == self.begin.size:
                self.begin = np.resize(self.begin, 2 * self.n)
                self.end = np.resize(self.end, 2 * self.n)
        self.begin[self.n] = t
        self.end[self.n] = math.inf
        self.n += 1

    def close(self, t: float) -> None:
        if self.n and self.end[self.n - 1] == math.inf:
            self.end[self.n - 1] = t

    def fold(self, horizon: float) -> None:
        """Fold the intervals that ended by ``horizon`` into the total."""
        k = int(np.searchsorted(self.end[: self.n], horizon, side="right"))
        if k == 0:
            return
        self.folded_s += float((self.end[:k] - self.begin[:k]).sum())
        self.folded_lo = min(self.folded_lo, float(self.begin[0]))
        self.folded_hi = max(self.folded_hi, float(self.end[k - 1]))
        rest = self.n - k
        self.begin[:rest] = self.begin[k : self.n]
        self.end[:rest] = self.end[k : self.n]
        self.n = rest

    def seconds(self, lo: float, hi: float, cap: float) -> float:
        """Busy seconds within ``[lo, hi]``, open intervals ending at ``cap``."""
        ends = np.minimum(self.end[: self.n], cap)
        live = np.clip(np.minimum(ends, hi) - np.maximum(self.begin[: self.n], lo), 0.0, None)
        total = float(live.sum())
        if self.folded_s > 0:
            span = self.folded_hi - self.folded_lo
            covered = _overlap(self.folded_lo, self.folded_hi, lo, hi)
            total += self.folded_s if covered >= span else self.folded_s * covered / span
        return total


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


class Meter:
    """Records instance lifecycles and busy intervals; thread-safe."""

    def __init__(self, clock: Clock, retention_s: float = 300.0):
        self.clock = clock
        self.retention_s = float(retention_s)
        self._records: dict[str, _Record] = {}
        self._lock = threading.Lock()

    def _now(self, at: float | None) -> float:
        return self.clock.now() if at is None else float(at)

    def start(
        self, instance_id: str, name: str, memory_mb: float, vcpus: float, at: float | None = None
    ) -> None:
        with self._lock:
            self._records[instance_id] = _Record(name, memory_mb, vcpus, self._now(at))

    def ready(self, instance_id: str, cold_start_s: float) -> None:
        with self._lock:
            self._records[instance_id].cold_start_s = float(cold_start_s)

    def busy_begin(self, instance_id: str, at: float | None = None) -> None:
        with self._lock:
            rec = self._records[instance_id]
            if rec.stopped_at is not None:
                return
            rec.depth += 1
            if rec.depth == 1:
                now = self._now(at)
                rec.busy.open(now, horizon=now - self.retention_s)

    def busy_end(self, instance_id: str, at: float | None = None) -> None:
        with self._lock:
            rec = self._records[instance_id]
            if rec.depth == 0:
                return  # closed by stop() already
            rec.depth -= 1
            if rec.depth == 0:
                rec.busy.close(self._now(at))

    def stop(self, instance_id: str, at: float | None = None) -> None:
        """The instance is gone: billing ends, an open busy interval closes."""
        with self._lock:
            rec = self._records.get(instance_id)
            if rec is None or rec.stopped_at is not None:
                return
            rec.stopped_at = self._now(at)
            if rec.depth:
                rec.busy.close(rec.stopped_at)
                rec.depth = 0

    def report(self, start: float | None = None, end: float | None = None) -> MeteringReport:
        """Usage within ``[start, end]`` (default: from the first spawn to now)."""
        with self._lock:
            now = self.clock.now()
            lo = min((r.started_at for r in self._records.values()), default=now)
            lo = lo if start is None else float(start)
            hi = now if end is None else float(end)
            report = MeteringReport(start=lo, end=hi)
            for iid, rec in self._records.items():
                stopped = now if rec.stopped_at is None else rec.stopped_at
                alive = _overlap(rec.started_at, stopped, lo, hi)
                spawned_in = lo <= rec.started_at <= hi
                if alive == 0.0 and not spawned_in:
                    continue
                busy = rec.busy.seconds(lo, hi, cap=min(stopped, now))
                gb = rec.memory_mb / 1024
                usage = Usage(
                    allocated_gb_s=gb * alive,
                    busy_gb_s=gb * busy,
                    vcpu_s=rec.vcpus * alive,
                    busy_vcpu_s=rec.vcpus * busy,
                    alive_s=alive,
                    busy_s=busy,
                    cold_starts=int(spawned_in),
                    cold_start_s_total=(rec.cold_start_s or 0.0) if spawned_in else 0.0,
                    instances=1,
                )
                report.instances[iid] = usage
                report.functions.setdefault(rec.name, Usage()).add(usage)
                report.total.add(usage)
            return report

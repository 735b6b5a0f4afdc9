"""The function platform interface: what the gateway needs from Knative,
OpenFaaS or the embedded local platform (docs/architecture.md, principle 3).

A *function* is a :class:`FunctionSpec` (what to run, with how much memory and
how many vCPUs, kept warm for how long); an *instance* is one running copy of
it with its own URL. The gateway's load-aware queues decide when to
:meth:`Platform.launch` another instance and which instance takes work; the
platform starts and stops instances, scales idle ones to zero after their
keep-alive, and meters what they cost (metering.py).

Instance states::

    starting -> ready <-> busy -> stopped
           \\-> failed  (could not start, or the process died)
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

from gnn_faas.errors import GnnFaasError, InvalidRequest
from gnn_faas.scheduler.platform.metering import MeteringReport

KINDS = ("memory", "compute")
STATES = ("starting", "ready", "busy", "stopped", "failed")


class PlatformNotAvailable(GnnFaasError):
    """A platform backend that this build does not provide (yet)."""

    http_status = 501


@dataclass(frozen=True)
class FunctionSpec:
    """One function: ``gnn-faas serve KIND *args`` with ``memory_mb`` of memory
    (billed, and the memory function's cache limit) and ``vcpus`` (billed; the
    local platform sets the instance's thread count from it). ``env``: extra
    environment variables as ``(name, value)`` pairs."""

    name: str
    kind: str
    args: tuple[str, ...]
    memory_mb: int
    vcpus: float = 1.0
    keep_alive_s: float = 600.0
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequest("a function needs a name")
        if self.kind not in KINDS:
            raise InvalidRequest(f"function kind must be one of {KINDS}, got {self.kind!r}")
        if self.memory_mb <= 0 or self.vcpus <= 0:
            raise InvalidRequest("memory_mb and vcpus must be positive")
        if self.keep_alive_s < 0:
            raise InvalidRequest("keep_alive_s must be >= 0")


@dataclass
class Instance:
    """A snapshot of one instance. Times are the platform clock's seconds;
    ``cold_start_s`` is the measured spawn-to-ready wall time."""

    id: str
    spec: FunctionSpec
    url: str
    pid: int | None
    state: str = "starting"
    started_at: float = 0.0
    ready_at: float | None = None
    last_used: float = 0.0
    cold_start_s: float | None = None

    @property
    def available(self) -> bool:
        """Can take work now (ready, or busy with room for more)."""
        return self.state in ("ready", "busy")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = {**asdict(self.spec), "args": list(self.spec.args)}
        return d


class Platform(ABC):
    """Starts, tracks, meters and stops function instances."""

    name = "abstract"
    # each instance has its own URL (a process, a container); False where the
    # instances are slots behind one platform URL whose router picks a replica
    addresses_instances = True

    @abstractmethod
    def launch(self, spec: FunctionSpec) -> Instance:
        """Start an instance and block until it is ready (a cold start).
        Raises :class:`~gnn_faas.errors.Unavailable` if it cannot start."""

    @abstractmethod
    def stop(self, instance_id: str) -> None:
        """Stop an instance (no-op if it already stopped)."""

    @abstractmethod
    def instances(self, name: str | None = None) -> list[Instance]:
        """Snapshots of the instances not yet stopped (of function ``name``)."""

    @abstractmethod
    def busy(self, instance_id: str) -> contextlib.AbstractContextManager[Instance]:
        """``with platform.busy(id):`` marks the instance busy while a call runs
        (busy GB-s, vCPU-s) and refreshes its ``last_used`` (keep-alive)."""

    @abstractmethod
    def reap(self) -> list[str]:
        """Stop instances idle longer than their keep-alive and drop failed
        ones (scale to zero); the ids removed."""

    @abstractmethod
    def metering(self, start: float | None = None, end: float | None = None) -> MeteringReport:
        """Usage of every instance within ``[start, end]`` (platform clock)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every instance and background thread."""

    # -- conveniences ----------------------------------------------------------
    def replicas(self, name: str) -> dict:
        """Replica figures of function ``name`` for ``gnn-faas status``. Where the
        gateway scales the function itself (local), desired and actual are its
        live instances and ready those that can take work; platforms that own
        the replica count (Knative, OpenFaaS) report what their API says."""
        live = [i for i in self.instances(name) if i.state in ("starting", "ready", "busy")]
        return {
            "function": name,
            "desired": len(live),
            "actual": len(live),
            "ready": sum(i.available for i in live),
            "revision": None,
            "error": None,
        }

    def endpoints(self, name: str | None = None) -> list[str]:
        """URLs of the instances that can take work now."""
        return [i.url for i in self.instances(name) if i.available]

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

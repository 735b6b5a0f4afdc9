"""Whether a graph store answers, what its outages cost, and who gets to probe it.

Every remote backend (S3, Redis) reports each store call's outcome here,
keyed by the store's URI without credentials. An outage begins at the first
call that fails for the store's reasons (a timeout, a refused connection,
throttling after the retry budget is spent) and ends at the next call that
succeeds. While it lasts:

- it is logged at warning level once when it begins (with the cause), at most
  once a minute while it lasts, and once when it ends (with its length);
- calls fail fast with :class:`~gnn_faas.errors.StoreUnavailable` (503,
  ``Retry-After``) instead of waiting out a timeout each, except one probe call
  at a time, at most every ``probe_interval_s``: the first probe that
  succeeds ends the outage, so service is back within about that interval of
  the store's return;
- ``gnn_faas_store_up`` is 0 and ``gnn_faas_store_errors_total`` counts the
  failed calls by kind (``timeout``, ``unreachable``, ``throttled``,
  ``fail_fast``).

Nothing here blocks: the state is a few fields under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from gnn_faas.errors import StoreUnavailable

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger("gnn_faas.storage")

PROBE_INTERVAL_S = 1.0
REMIND_EVERY_S = 60.0


def public_uri(uri: str) -> str:
    """``uri`` without user, password or query (what logs and labels may show)."""
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class StoreHealth:
    """The health of one store (see the module docstring)."""

    def __init__(self, uri: str, probe_interval_s: float = PROBE_INTERVAL_S, clock=time.monotonic):
        self.uri = public_uri(uri)
        self.probe_interval_s = float(probe_interval_s)
        self._clock = clock
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.cause = ""
        self._last_attempt = 0.0
        self._probing = False
        self._reminded = 0.0
        self.errors: dict[str, int] = {}
        self.outages = 0
        self._in_flight: dict[int, float] = {}
        self._calls = 0

    @property
    def up(self) -> bool:
        return self.down_since is None

    def admit(self) -> bool:
        """Whether a call may go to the store now: always while it is up; while
        it is down, one probe at a time, ``probe_interval_s`` after the last
        attempt. Raises :class:`StoreUnavailable` for a call that may not."""
        with self._lock:
            if self.down_since is None:
                return False
            now = self._clock()
            if not self._probing and now - self._last_attempt >= self.probe_interval_s:
                self._probing = True
                self._last_attempt = now
                return True
        raise self.fail_fast()

    def fail_fast(self) -> StoreUnavailable:
        """The error of a call refused during an outage (counted)."""
        with self._lock:
            self.errors["fail_fast"] = self.errors.get("fail_fast", 0) + 1
            down_s = 0.0 if self.down_since is None else self._clock() - self.down_since
            cause = self.cause
        return StoreUnavailable(
            f"graph store {self.uri} is unavailable (for {down_s:.1f} s: {cause}); retry later"
        )

    def call_started(self) -> int:
        """A store call begins; pass the token to :meth:`call_ended`."""
        with self._lock:
            self._calls += 1
            self._in_flight[self._calls] = self._clock()
            return self._calls

    def call_ended(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)

    def stalled_for(self) -> float:
        """Seconds the oldest store call in flight has waited (0: none): a store
        that hangs shows here before any call times out."""
        with self._lock:
            if not self._in_flight:
                return 0.0
            return self._clock() - min(self._in_flight.values())

    def succeeded(self, probe: bool = False) -> None:
        with self._lock:
            if probe:
                self._probing = False
            if self.down_since is None:
                return
            down_s = self._clock() - self.down_since
            self.down_since = None
            self.cause = ""
        log.warning("graph store %s is back after %.1f s", self.uri, down_s)

    def failed(self, kind: str, cause: str, probe: bool = False) -> None:
        """A call failed for the store's reasons after its retries (``kind``:
        ``timeout``, ``unreachable``, ``throttled``). A store that times out or
        cannot be reached is down; one that throttles is answering (slowly
        enough to say so): that call fails, the next ones still go."""
        now = self._clock()
        with self._lock:
            if probe:
                self._probing = False
            self.errors[kind] = self.errors.get(kind, 0) + 1
            if kind == "throttled" and self.down_since is None:
                return
            self._last_attempt = now
            began = self.down_since is None
            if began:
                self.down_since = now
                self.outages += 1
                self._reminded = now
            self.cause = cause
            remind = not began and now - self._reminded >= REMIND_EVERY_S
            if remind:
                self._reminded = now
            down_s = now - self.down_since
        if began:
            log.warning("graph store %s is unavailable: %s", self.uri, cause)
        elif remind:
            log.warning(
                "graph store %s still unavailable after %.0f s: %s", self.uri, down_s, cause
            )

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "store": self.uri,
                "up": self.down_since is None,
                "down_s": 0.0 if self.down_since is None else self._clock() - self.down_since,
                "cause": self.cause,
                "outages": self.outages,
                "errors": dict(self.errors),
            }


_registry: dict[str, StoreHealth] = {}
_registry_lock = threading.Lock()


def health_of(uri: str) -> StoreHealth:
    """The process-wide :class:`StoreHealth` of the store at ``uri``."""
    key = public_uri(uri)
    with _registry_lock:
        h = _registry.get(key)
        if h is None:
            h = _registry[key] = StoreHealth(uri)
        return h


def reset() -> None:
    """Forget every store's health (tests: each starts with every store up)."""
    with _registry_lock:
        _registry.clear()


def all_health() -> list[StoreHealth]:
    with _registry_lock:
        return list(_registry.values())


def store_health_families() -> Iterator[Metric]:
    """``gnn_faas_store_up`` and ``gnn_faas_store_errors_total`` of every store this
    process has called."""
    # (here: every store client imports this module, and only a process that
    # serves metrics needs prometheus_client, ~30 ms to import)
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    up = GaugeMetricFamily(
        "gnn_faas_store_up", "1 while the graph store answers, 0 during an outage", labels=["store"]
    )
    errs = CounterMetricFamily(
        "gnn_faas_store_errors",
        "Graph store calls that failed for the store's reasons, by kind",
        labels=["store", "kind"],
    )
    outages = CounterMetricFamily(
        "gnn_faas_store_outages", "Graph store outages begun", labels=["store"]
    )
    for h in all_health():
        d = h.as_dict()
        up.add_metric([d["store"]], 1.0 if d["up"] else 0.0)
        outages.add_metric([d["store"]], d["outages"])
        for kind, n in sorted(d["errors"].items()):
            errs.add_metric([d["store"], kind], n)
    yield up
    yield errs
    yield outages

"""Prometheus series every gnn-faas process that serves ``/metrics`` shares.

Conventions (https://prometheus.io/docs/practices/naming/): names start with
``gnn_faas_``; counters end in ``_total``; quantities are in base units
(seconds, bytes; memory x time in byte-seconds); a rate or ratio is left to
the query (``rate(hits_total) / rate(lookups_total)``), except where a gauge
of the current value is what an operator looks at.

- :func:`new_registry`: a registry of its own (several apps in one process,
  as in the tests, never share series) with prometheus_client's process
  (``process_*``: CPU seconds, resident memory, open fds, start time),
  platform (``python_info``) and garbage-collector (``python_gc_*``) collectors;
- :func:`storage_families`: what one process read from its graph store, per
  backend (``file``, ``s3``, ``redis``) and graph: bytes transferred, bytes
  needed, requests (coalesced ranges: an S3 ranged GET, a Redis GETRANGE
  each), round trips (batched backend calls) and seconds;
- :func:`http_families`: the :class:`~gnn_faas.http.RequestTimer` figures;
- :class:`CallbackCollector`: families computed at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def new_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors of this process."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if GC_COLLECTOR is not None:  # CPython only
        GCCollector(registry=registry)
    return registry


class CallbackCollector:
    """Families from callables, computed at every scrape."""

    def __init__(self, fns: Iterable[Callable[[], Iterator[Metric]]] = ()):
        self.fns: list[Callable[[], Iterator[Metric]]] = list(fns)

    def describe(self):
        return []

    def collect(self):
        for fn in list(self.fns):
            yield from fn()


def backend_name(uri: str) -> str:
    """The backend label of a store URI: its scheme (``file`` for a bare path)."""
    return urlsplit(uri).scheme or "file"


_STORAGE = (
    # (ReadStats field, series name, help)
    ("bytes_read", "read_bytes", "Bytes transferred from the graph store (coalescing reads a few extra)"),
    ("bytes_needed", "needed_bytes", "Bytes the reads asked for (the union of the requested ranges)"),
    ("ranges_requested", "requests", "Requests to the graph store: coalesced ranges (an S3 ranged GET, a Redis GETRANGE)"),
    ("round_trips", "round_trips", "Batched calls to the graph store (one per read of a set of ranges)"),
    ("read_seconds", "read_seconds", "Seconds spent waiting for the graph store"),
)  # fmt: skip


def storage_families(sources: Iterable[tuple[str, str, object]]) -> Iterator[Metric]:
    """Read counters (``gnn_faas_storage_*_total``) of ``(backend, graph, stats)``
    triples (``stats``: a cumulative :class:`~gnn_faas.storage.ranges.ReadStats`);
    triples with the same labels are summed."""
    sums: dict[tuple[str, str], list[float]] = {}
    for backend, graph, stats in sources:
        row = sums.setdefault((backend, graph), [0.0] * len(_STORAGE))
        for i, (key, _, _) in enumerate(_STORAGE):
            row[i] += float(getattr(stats, key))
    for i, (_, name, help_text) in enumerate(_STORAGE):
        fam = CounterMetricFamily(
            f"gnn_faas_storage_{name}", help_text, labels=["backend", "graph"]
        )
        for labels, row in sorted(sums.items()):
            fam.add_metric(list(labels), row[i])
        yield fam


def http_families(timer) -> Iterator[Metric]:
    """Counters of a :class:`~gnn_faas.http.RequestTimer` (every HTTP request served)."""
    t = timer.as_dict()
    requests = CounterMetricFamily("gnn_faas_http_requests", "HTTP requests served")
    requests.add_metric([], t["requests"])
    errors = CounterMetricFamily(
        "gnn_faas_http_errors", "HTTP requests answered with a 4xx or 5xx status"
    )
    errors.add_metric([], t["errors"])
    seconds = CounterMetricFamily(
        "gnn_faas_http_request_seconds", "Seconds spent serving HTTP requests (summed)"
    )
    seconds.add_metric([], t["seconds"])
    yield from (requests, errors, seconds)

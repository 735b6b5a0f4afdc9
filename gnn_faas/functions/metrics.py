"""``GET /metrics`` of the memory and compute functions (Prometheus text).

Each function app gets its own registry (:func:`gnn_faas.metrics.new_registry`:
``process_*``, ``python_*``), the HTTP counters (``gnn_faas_http_*``) and its
role's families, all computed from the figures ``/v1/stats`` shows, at scrape
time (nothing is counted twice on the request path):

memory (labels ``graph``)
    ``gnn_faas_cache_{lookups,hits,misses,evictions,admissions}_total``: the
    feature cache, per row looked up; its hit rate over a window is
    ``rate(hits_total) / rate(lookups_total)``, since start
    ``gnn_faas_cache_hit_ratio``; ``gnn_faas_cache_rows``,
    ``gnn_faas_cache_capacity_rows``, ``gnn_faas_cache_bytes``;
    ``gnn_faas_memory_limit_bytes`` (this worker's share),
    ``gnn_faas_memory_reexecutions_total`` (requests re-run under the memory
    protocol) and the storage reads of :func:`gnn_faas.metrics.storage_families`;
compute
    ``gnn_faas_device_transfers_total{direction}``,
    ``gnn_faas_device_transfer_bytes_total{direction}`` (host <-> device moves);
both
    ``gnn_faas_function_calls_total{role, endpoint}``.

With ``--workers N`` each worker answers for itself (a scrape reaches one).
No torch here (the memory function imports this module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flask import Flask, Response
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gnn_faas.metrics import (
    CONTENT_TYPE,
    CallbackCollector,
    backend_name,
    http_families,
    new_registry,
    storage_families,
)
from gnn_faas.storage.store_health import store_health_families


def install_metrics(app: Flask, families: Callable[[], Iterator[Metric]]) -> None:
    """Serve ``GET /metrics`` on ``app``: process, HTTP and ``families()`` series."""
    registry = new_registry()
    timer = app.extensions["gnn_faas_timer"]
    registry.register(CallbackCollector([lambda: http_families(timer), families]))

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), content_type=CONTENT_TYPE)


def calls_family(role: str, counts: dict[str, int]) -> Metric:
    fam = CounterMetricFamily(
        "gnn_faas_function_calls",
        "Calls served by this function instance, per endpoint",
        labels=["role", "endpoint"],
    )
    for endpoint, n in sorted(counts.items()):
        fam.add_metric([role, endpoint], n)
    return fam


def memory_families(fn) -> Iterator[Metric]:
    """The series of a :class:`~gnn_faas.functions.memory_app.MemoryFunction`."""
    yield from store_health_families()  # outages of the store it reads
    graph = fn.graph.name
    cache = fn.cache.as_dict()
    for key, help_text in (
        ("lookups", "Feature rows looked up in the cache"),
        ("hits", "Feature rows found in the cache"),
        ("misses", "Feature rows read from the store on a cache miss"),
        ("evictions", "Rows evicted from the cache"),
        ("admissions", "Rows admitted into the cache"),
    ):
        fam = CounterMetricFamily(f"gnn_faas_cache_{key}", help_text, labels=["graph"])
        fam.add_metric([graph], cache[key])
        yield fam
    for name, value, help_text in (
        ("cache_hit_ratio", cache["hit_rate"], "Cache hits / lookups since the instance started"),
        ("cache_rows", cache["rows"], "Rows in the cache"),
        ("cache_capacity_rows", cache["capacity_rows"], "Rows the cache may hold now"),
        ("cache_bytes", cache["bytes"], "Bytes of cached rows"),
        ("memory_limit_bytes", fn.limit_bytes, "Memory limit of this worker"),
    ):
        fam = GaugeMetricFamily(f"gnn_faas_{name}", help_text, labels=["graph"])
        fam.add_metric([graph], float(value))
        yield fam
    reexec = CounterMetricFamily(
        "gnn_faas_memory_reexecutions",
        "Requests re-executed after the cache shrank under the memory protocol",
        labels=["graph"],
    )
    reexec.add_metric([graph], cache["reexecutions"])
    yield reexec
    states = fn.state_stats()  # SRPE: stored layer-1 states read for recomputed candidates
    for key, help_text in (
        ("rows", "Stored aggregate-state rows read (precomputed serving's recomputed candidates)"),
        ("bytes", "Bytes of stored aggregate-state rows read from the store"),
    ):
        fam = CounterMetricFamily(f"gnn_faas_state_{key}_read", help_text, labels=["graph"])
        fam.add_metric([graph], states[f"state_{key}_read"])
        yield fam
    yield calls_family("memory", fn.counts)
    yield from storage_families([(backend_name(fn.cfg.store), graph, fn.fetcher.stats)])


def compute_families(counts: dict[str, int], transfers: dict[str, int]) -> Iterator[Metric]:
    """The series of a compute function: calls per stage and device transfers
    (``transfers``: :class:`~gnn_faas.functions.update.TransferStats` as a dict)."""
    yield calls_family("compute", counts)
    moves = CounterMetricFamily(
        "gnn_faas_device_transfers", "Host <-> device moves of arrays", labels=["direction"]
    )
    size = CounterMetricFamily(
        "gnn_faas_device_transfer_bytes", "Bytes moved host <-> device", labels=["direction"]
    )
    for direction in ("to_device", "from_device"):
        moves.add_metric([direction], transfers.get(direction, 0))
        size.add_metric([direction], transfers.get(f"bytes_{direction}", 0))
    yield moves
    yield size

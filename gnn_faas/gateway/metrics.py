"""Gateway metrics in one place: Prometheus series (``gnn_faas_*``, seconds and
bytes as units, counters ending in ``_total``; see :mod:`gnn_faas.metrics`)
and the stage timer that feeds them.

Each :class:`GatewayMetrics` owns its own registry (with the process
collectors), so several gateways (tests, benchmarks) in one process never
share counters. :func:`metering_families` turns the platform's metering into
counters per function, in base units::

    gnn_faas_function_allocated_memory_byte_seconds_total = memory_mb · 2^20 · alive seconds
    gnn_faas_function_busy_memory_byte_seconds_total      = memory_mb · 2^20 · busy seconds
    gnn_faas_function_vcpu_seconds_total                  = vCPUs · alive seconds
    gnn_faas_function_busy_vcpu_seconds_total             = vCPUs · busy seconds
    gnn_faas_function_alive_seconds_total, gnn_faas_function_busy_seconds_total
    gnn_faas_function_cold_starts_total, gnn_faas_function_cold_start_seconds_total

(the platform keeps every instance's record, so these never decrease).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric

from gnn_faas.metrics import CallbackCollector, new_registry

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
STAGES = ("queued", "parse", "khop", "buffer_wait", "merge", "execute", "respond")


class GatewayMetrics:
    def __init__(self):
        self.registry = new_registry()
        r = self.registry
        self.requests = Counter(
            "gnn_faas_requests", "Inference requests", ["model", "kind", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "gnn_faas_request_seconds",
            "End-to-end inference latency at the gateway",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "gnn_faas_stage_seconds",
            "Time per request-path stage",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.slo_violations = Counter(
            "gnn_faas_slo_violations", "Requests answered after their SLO", ["model"], registry=r
        )
        self.shed = Counter(
            "gnn_faas_requests_shed",
            "Requests shed by admission control (503 + Retry-After), not served",
            ["model"],
            registry=r,
        )
        self.buffers_closed = Counter(
            "gnn_faas_buffers_closed",
            "Graph-sharing buffers closed",
            ["model", "reason"],
            registry=r,
        )
        self.version_moves = Counter(
            "gnn_faas_version_moves",
            "Requests of a closed buffer moved onto the newest graph version among its "
            "requests (their k-hop fetched again there) to run in one execution",
            ["model"],
            registry=r,
        )
        self.sharing_degree = Histogram(
            "gnn_faas_buffer_sharing_degree",
            "Sharing degree of each closed buffer",
            ["model"],
            buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
            registry=r,
        )
        self.aggregated_rows = Counter(
            "gnn_faas_aggregated_rows", "(vertex, layer) rows aggregated", ["model"], registry=r
        )
        self._callbacks = CallbackCollector()
        r.register(self._callbacks)

    def add_collector(self, fn: Callable[[], Iterator[Metric]]) -> None:
        """Families computed at scrape time (instances, queues, metering, storage reads)."""
        self._callbacks.fns.append(fn)

    def add_model(self, model: str) -> None:
        """Start the per-model counters at zero, so every series exists (and a
        dashboard's query answers) before the first shed request or late answer."""
        for counter in (self.slo_violations, self.shed, self.aggregated_rows):
            counter.labels(model)

    @contextmanager
    def stage(self, model: str, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(model, stage).observe(time.perf_counter() - t0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


_METERING = (
    # (Usage field, series name, help, factor to base units)
    ("allocated_gb_s", "allocated_memory_byte_seconds", "Allocated memory x alive time", 2**30),
    ("busy_gb_s", "busy_memory_byte_seconds", "Allocated memory x busy time", 2**30),
    ("vcpu_s", "vcpu_seconds", "vCPUs x alive time", 1),
    ("busy_vcpu_s", "busy_vcpu_seconds", "vCPUs x busy time", 1),
    ("alive_s", "alive_seconds", "Instance alive time (spawn to stop)", 1),
    ("busy_s", "busy_seconds", "Instance time with at least one call in flight", 1),
    ("cold_starts", "cold_starts", "Instances started (cold starts)", 1),
    ("cold_start_s_total", "cold_start_seconds", "Spawn-to-ready time of cold starts", 1),
)


def metering_families(report) -> Iterator[Metric]:
    """Counters per function of a whole-history
    :class:`~gnn_faas.scheduler.platform.metering.MeteringReport`."""
    by_function = report.by_function()
    for key, name, help_text, factor in _METERING:
        fam = CounterMetricFamily(f"gnn_faas_function_{name}", help_text, labels=["function"])
        for fn, usage in sorted(by_function.items()):
            fam.add_metric([fn], float(usage[key]) * factor)
        yield fam

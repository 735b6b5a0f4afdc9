"""Gateway metrics in one place: Prometheus series (``gnn_faas_*``, seconds and
bytes as units) and the stage timer that feeds them.

Each :class:`GatewayMetrics` owns its own registry, so several gateways (tests,
benchmarks) in one process never share counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
STAGES = ("queued", "parse", "khop", "buffer_wait", "merge", "execute", "respond")


class GatewayMetrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.bytes_fetched = Counter(
            "gnn_faas_gateway_storage_read_bytes",
            "Bytes the gateway read from storage for k-hop vertex sets",
            ["model"],
            registry=r,
        )
        self._collectors: list[Callable[[], Iterator[GaugeMetricFamily]]] = []
        r.register(_CallbackCollector(self._collectors))

    def add_collector(self, fn: Callable[[], Iterator[GaugeMetricFamily]]) -> None:
        """Gauges computed at scrape time (instances, queues, metering)."""
        self._collectors.append(fn)

    @contextmanager
    def stage(self, model: str, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(model, stage).observe(time.perf_counter() - t0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CallbackCollector:
    def __init__(self, fns):
        self._fns = fns

    def describe(self):
        return []

    def collect(self):
        for fn in list(self._fns):
            yield from fn()

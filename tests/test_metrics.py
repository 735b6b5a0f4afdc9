"""Prometheus families shared by every server: names, units and sums."""

from __future__ import annotations

from prometheus_client import generate_latest

from gnn_faas.clock import FakeClock
from gnn_faas.gateway.metrics import GatewayMetrics, metering_families
from gnn_faas.metrics import backend_name, new_registry, storage_families
from gnn_faas.scheduler.platform.metering import Meter
from gnn_faas.storage.ranges import ReadStats


def values(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_storage_reads_are_counters_per_backend_and_graph_summed():
    a = ReadStats(bytes_read=100, bytes_needed=90, ranges_requested=3, round_trips=1)
    b = ReadStats(bytes_read=50, bytes_needed=50, ranges_requested=2, round_trips=2)
    c = ReadStats(bytes_read=7, read_seconds=0.5)
    got = values(storage_families([("s3", "g", a), ("s3", "g", b), ("file", "h", c)]))
    g, h = (("backend", "s3"), ("graph", "g")), (("backend", "file"), ("graph", "h"))
    assert got[("gnn_faas_storage_read_bytes_total", g)] == 150
    assert got[("gnn_faas_storage_needed_bytes_total", g)] == 140
    assert got[("gnn_faas_storage_requests_total", g)] == 5
    assert got[("gnn_faas_storage_round_trips_total", g)] == 3
    assert got[("gnn_faas_storage_read_seconds_total", h)] == 0.5
    assert got[("gnn_faas_storage_read_bytes_total", h)] == 7
    assert [backend_name(u) for u in ("s3://b/p", "redis://h:6379/0", "/srv/store")] == [
        "s3",
        "redis",
        "file",
    ]


def test_metering_counters_are_in_base_units():
    clock = FakeClock()
    meter = Meter(clock)
    meter.start("i1", "m-memory", memory_mb=512, vcpus=2)
    meter.ready("i1", cold_start_s=1.5)
    clock.advance(10)
    meter.busy_begin("i1")
    clock.advance(4)
    meter.busy_end("i1")
    got = values(metering_families(meter.report()))
    fn = (("function", "m-memory"),)
    assert got[("gnn_faas_function_allocated_memory_byte_seconds_total", fn)] == 512 * 2**20 * 14
    assert got[("gnn_faas_function_busy_memory_byte_seconds_total", fn)] == 512 * 2**20 * 4
    assert got[("gnn_faas_function_vcpu_seconds_total", fn)] == 2 * 14
    assert got[("gnn_faas_function_busy_vcpu_seconds_total", fn)] == 2 * 4
    assert got[("gnn_faas_function_cold_starts_total", fn)] == 1
    assert got[("gnn_faas_function_cold_start_seconds_total", fn)] == 1.5


def test_registries_have_the_process_collectors_and_models_start_at_zero():
    text = generate_latest(new_registry()).decode()
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info"):
        assert f"\n{name}" in text, name
    m = GatewayMetrics()
    m.add_model("btc")
    text = m.render().decode()
    for name in ("gnn_faas_requests_shed_total", "gnn_faas_slo_violations_total"):
        assert f'{name}{{model="btc"}} 0.0' in text
    assert "process_open_fds" in text

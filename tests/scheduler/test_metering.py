"""Metering of instance lifecycles, exact with a fake clock."""

from __future__ import annotations

import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.scheduler.platform.metering import Meter


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


def test_alive_and_busy_seconds(clock):
    meter = Meter(clock)
    meter.start("m-1", "mem", memory_mb=512, vcpus=0.5)
    clock.advance(0.25)
    meter.ready("m-1", cold_start_s=0.25)
    clock.advance(1.75)
    meter.busy_begin("m-1")
    clock.advance(3.0)
    meter.busy_end("m-1")
    clock.advance(5.0)
    meter.stop("m-1")
    clock.advance(100.0)  # stopped: no more billing

    usage = meter.report().instances["m-1"]
    assert usage.alive_s == pytest.approx(10.0)
    assert usage.busy_s == pytest.approx(3.0)
    assert usage.allocated_gb_s == pytest.approx(0.5 * 10.0)
    assert usage.busy_gb_s == pytest.approx(0.5 * 3.0)
    assert usage.vcpu_s == pytest.approx(0.5 * 10.0)
    assert usage.busy_vcpu_s == pytest.approx(0.5 * 3.0)
    assert usage.cold_starts == 1 and usage.cold_start_s_total == pytest.approx(0.25)


def test_overlapping_calls_are_counted_once(clock):
    meter = Meter(clock)
    meter.start("c-1", "cmp", memory_mb=1024, vcpus=2)
    meter.busy_begin("c-1")  # t=0
    clock.advance(1)
    meter.busy_begin("c-1")  # second call overlaps: t=1..3
    clock.advance(2)
    meter.busy_end("c-1")  # t=3, first still running
    clock.advance(1)
    meter.busy_end("c-1")  # t=4
    clock.advance(6)
    meter.busy_begin("c-1")  # t=10..12
    clock.advance(2)
    meter.busy_end("c-1")
    usage = meter.report().instances["c-1"]
    assert usage.busy_s == pytest.approx(6.0)
    assert usage.busy_vcpu_s == pytest.approx(12.0)
    assert usage.alive_s == pytest.approx(12.0)  # still alive: counted up to now


def test_window_clips_and_counts_cold_starts_inside(clock):
    meter = Meter(clock)
    meter.start("a", "mem", 256, 1)  # t=100
    meter.ready("a", 0.4)
    clock.advance(10)
    meter.start("b", "mem", 256, 1)  # t=110
    meter.ready("b", 0.6)
    meter.busy_begin("b")
    clock.advance(10)  # t=120
    meter.busy_end("b")
    meter.stop("a")
    clock.advance(10)  # t=130

    report = meter.report(start=105, end=125)
    a, b = report.instances["a"], report.instances["b"]
    assert a.alive_s == pytest.approx(15.0) and a.cold_starts == 0
    assert b.alive_s == pytest.approx(15.0) and b.cold_starts == 1
    assert b.busy_s == pytest.approx(10.0)
    assert report.total.cold_starts == 1
    assert report.total.cold_start_s_total == pytest.approx(0.6)
    assert report.functions["mem"].allocated_gb_s == pytest.approx(0.25 * 30)
    assert report.by_function()["mem"]["instances"] == 2
    # A window after "a" stopped does not list it.
    assert set(meter.report(start=121).instances) == {"b"}


def test_stop_closes_an_open_call(clock):
    meter = Meter(clock)
    meter.start("x", "mem", 128, 1)
    meter.busy_begin("x")
    clock.advance(2)
    meter.stop("x")  # crashed mid-call
    clock.advance(5)
    meter.busy_end("x")  # the caller notices later: ignored
    meter.busy_begin("x")  # ignored on a stopped instance
    clock.advance(5)
    usage = meter.report().instances["x"]
    assert usage.busy_s == pytest.approx(2.0) and usage.alive_s == pytest.approx(2.0)


def test_totals_add_up(clock):
    meter = Meter(clock)
    for i, (name, mb) in enumerate([("mem", 256), ("mem", 512), ("cmp", 1024)]):
        meter.start(f"i{i}", name, mb, 1)
        clock.advance(1)
    report = meter.report()
    assert report.total.instances == 3
    assert report.total.allocated_gb_s == pytest.approx(
        sum(u.allocated_gb_s for u in report.instances.values())
    )
    assert report.total.allocated_gb_s == pytest.approx(0.25 * 3 + 0.5 * 2 + 1.0 * 1)
    assert set(report.as_dict()["by_function"]) == {"cmp", "mem"}


def test_busy_intervals_stay_bounded_and_reports_stay_exact(clock):
    """Hours of calls: old intervals fold into a total (bounded memory), and
    both the whole-life report and a recent window stay exact."""
    meter = Meter(clock, retention_s=60.0)
    meter.start("m-1", "mem", memory_mb=1024, vcpus=1)
    calls = 20_000  # one 0.1 s call every 0.5 s: 10,000 s
    for _ in range(calls):
        meter.busy_begin("m-1")
        clock.advance(0.1)
        meter.busy_end("m-1")
        clock.advance(0.4)
    rec = meter._records["m-1"]
    assert rec.busy.n <= 2 * 60 / 0.5 + 64  # about the retention window, not 20,000
    assert meter.report().total.busy_s == pytest.approx(calls * 0.1)
    now = clock.now()
    recent = meter.report(start=now - 30.0, end=now).total
    assert recent.busy_s == pytest.approx(60 * 0.1)

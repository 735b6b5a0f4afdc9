"""Store outages: when they begin and end, fail-fast with one probe, the log and
the figures (storage/store_health.py), and the backends' guarded calls."""

from __future__ import annotations

import logging

import pytest

from gnn_faas import deadline
from gnn_faas.errors import StoreUnavailable, TransientStorageError
from gnn_faas.storage import store_health
from gnn_faas.storage.store_health import StoreHealth, public_uri, store_health_families


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_an_outage_fails_fast_but_lets_one_probe_through(caplog):
    clock = FakeClock()
    h = StoreHealth("s3://b/p", probe_interval_s=1.0, clock=clock)
    assert h.admit() is False  # up: every call goes
    with caplog.at_level(logging.WARNING, "gnn_faas.storage"):
        h.failed("timeout", "S3 timed out on 'x'")
        h.failed("timeout", "S3 timed out on 'y'")  # still the same outage: no second line
    assert [r.getMessage() for r in caplog.records] == [
        "graph store s3://b/p is unavailable: S3 timed out on 'y'".replace("'y'", "'x'")
    ]
    assert not h.up
    with pytest.raises(StoreUnavailable, match=r"s3://b/p is unavailable .*timed out"):
        h.admit()  # within the probe interval: fail fast
    clock.t += 1.0
    assert h.admit() is True  # the probe
    with pytest.raises(StoreUnavailable):
        h.admit()  # one probe at a time
    h.failed("timeout", "again", probe=True)
    clock.t += 1.0
    assert h.admit() is True
    caplog.clear()
    with caplog.at_level(logging.WARNING, "gnn_faas.storage"):
        h.succeeded(probe=True)
    assert h.up and "back after 2.0 s" in caplog.records[0].getMessage()
    assert h.admit() is False
    d = h.as_dict()
    assert d["outages"] == 1 and d["errors"] == {"timeout": 3, "fail_fast": 2}


def test_throttling_is_counted_but_is_no_outage():
    h = StoreHealth("redis://h:1/0", clock=FakeClock())
    h.failed("throttled", "SlowDown")
    assert h.up and h.admit() is False and h.as_dict()["errors"] == {"throttled": 1}


def test_metrics_name_the_store_without_credentials():
    assert public_uri("redis://user:secret@host:6379/0?prefix=x") == "redis://host:6379/0"
    from gnn_faas.storage.store_health import health_of

    health_of("redis://user:secret@host:6379/0").failed("unreachable", "refused")
    fams = {f.name: f for f in store_health_families()}
    up = {tuple(s.labels.values()): s.value for s in fams["gnn_faas_store_up"].samples}
    assert up[("redis://host:6379/0",)] == 0.0
    text = repr([s for f in fams.values() for s in f.samples])
    assert "secret" not in text


def test_retries_stop_at_the_deadline_and_timeouts_are_not_retried(tmp_path, monkeypatch):
    from gnn_faas.storage.backends import open_backend

    backend = open_backend(f"file://{tmp_path}")
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)
    calls = []

    def failing(kind: str):
        def call():
            calls.append(kind)
            err = TransientStorageError(f"{kind} on x")
            err.kind = kind
            raise err

        return call

    with pytest.raises(StoreUnavailable, match="unreachable on x"):
        backend.guarded(failing("unreachable"), attempts=4)
    assert len(calls) == 4 and len(slept) == 3  # a refused connection is retried
    store_health.reset()
    calls.clear()
    with deadline.scope(0.0), pytest.raises(StoreUnavailable):
        backend.guarded(failing("unreachable"), attempts=4)
    assert len(calls) == 1  # no time left for a retry's backoff
    store_health.reset()
    calls.clear()
    with pytest.raises(StoreUnavailable, match="timeout on x"):
        backend.guarded(failing("timeout"), attempts=4)
    assert len(calls) == 1 and not backend.health.up  # a timeout is an outage at once


def test_a_hung_store_is_an_outage_named_in_the_error(store_uri, monkeypatch):
    """A real server behind a paused proxy (nothing answers): the read times out,
    the store is down, and the next call fails fast without waiting."""
    if store_uri.startswith("file"):
        pytest.skip("the file store has no network to hang")
    from gnn_faas.bench.store_proxy import StoreProxy, proxied, store_target
    from gnn_faas.storage.backends import open_backend

    open_backend(store_uri).pipe_file("k.bin", b"abc")
    with StoreProxy(store_target(store_uri)) as proxy:
        uri, env = proxied(store_uri, proxy.port)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        timeout = "socket_timeout" if uri.startswith("redis") else "read_timeout"
        uri += ("&" if "?" in uri else "?") + f"{timeout}=0.3&retries=1"
        backend = open_backend(uri)
        assert backend.cat_file("k.bin") == b"abc"  # through the proxy, flowing
        proxy.pause()
        with pytest.raises(StoreUnavailable, match="is unavailable") as err:
            backend.cat_file("k.bin")
        assert "timed out" in str(err.value) and not backend.health.up
        with pytest.raises(StoreUnavailable, match="retry later"):
            backend.cat_file("k.bin")  # fail fast: no call made, no timeout waited
        assert backend.health.as_dict()["errors"]["fail_fast"] == 1
        proxy.resume()
        backend.health.probe_interval_s = 0.0
        assert backend.cat_file("k.bin") == b"abc"  # the probe succeeds: back up
        assert backend.health.up

"""The shared instance table (platform/managed.py) driven through its hooks by an
in-memory backend: which hook runs when, with what, and what gets billed.
Deterministic (FakeClock, no processes); the real backends' tests
(test_local_platform.py, test_docker_platform.py) cover the hooks themselves."""

from __future__ import annotations

import pytest

from gnn_faas.clock import FakeClock
from gnn_faas.errors import NotFound, Unavailable
from gnn_faas.scheduler.platform.base import FunctionSpec, Instance
from gnn_faas.scheduler.platform.managed import ManagedPlatform, Running


class MemoryBackend(ManagedPlatform):
    """Instances are dict entries; ``exit(id)`` makes one exit."""

    name = "memory-backend"

    def __init__(self, clock: FakeClock):
        super().__init__(clock, stop_grace_s=2.0)
        self.exits: dict[str, str] = {}
        self.calls: list[tuple] = []
        self._start_reaper(None)

    def launch(self, spec: FunctionSpec) -> Instance:
        self._check_open()
        iid = self._new_id(spec)
        run = self._register(iid, spec, f"handle-{iid}", url="", pid=None, at=self.clock.now())
        self.clock.advance(1.0)  # one second starting
        return self._mark_ready(run, 0.5, url=f"http://x/{iid}")

    def _exited(self, live: dict[str, Running], force: bool) -> dict[str, str]:
        return {iid: why for iid, why in self.exits.items() if iid in live}

    def _terminate(self, run: Running, grace: float, *, count_exit: bool = False) -> None:
        self.calls.append(("terminate", run.handle, grace, count_exit))

    def _on_failure(self, run: Running, reason: str) -> None:
        self.calls.append(("failure", run.handle, reason))

    def _drop_failed(self, run: Running) -> None:
        self.calls.append(("drop", run.handle))

    def _close(self) -> None:
        self.calls.append(("close",))


def spec(keep_alive_s: float = 10.0) -> FunctionSpec:
    return FunctionSpec("f", "compute", (), memory_mb=1024, vcpus=1.0, keep_alive_s=keep_alive_s)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


def test_busy_keep_alive_and_billing(clock):
    with MemoryBackend(clock) as p:
        a = p.launch(spec(keep_alive_s=10.0))
        assert (a.id, a.state, a.started_at, a.ready_at, a.cold_start_s) == (
            "f-1", "ready", 100.0, 101.0, 0.5,
        )  # fmt: skip
        with p.busy(a.id) as during:
            assert during.state == "busy" and p.instances()[0].state == "busy"
            with p.busy(a.id):  # two calls in flight
                clock.advance(3.0)
            assert p.instances()[0].state == "busy"  # one still in flight
            clock.advance(1.0)
        assert p.instances()[0].state == "ready" and p.instances()[0].last_used == 105.0
        clock.advance(10.0)  # idle exactly the keep-alive: kept
        assert p.reap() == []
        clock.advance(0.5)
        assert p.reap() == ["f-1"] and p.instances() == []
        assert p.calls == [("terminate", "handle-f-1", 2.0, False)]
        report = p.metering()
        assert report.instances["f-1"].alive_s == pytest.approx(15.5)
        assert report.instances["f-1"].busy_s == pytest.approx(4.0)
        with pytest.raises(NotFound), p.busy("f-1"):
            pass


def test_an_exited_instance_fails_and_is_dropped(clock):
    with MemoryBackend(clock) as p:
        a, b = p.launch(spec()), p.launch(spec())
        p.exits[a.id] = "exit_137"
        assert [i.state for i in p.instances()] == ["failed", "ready"]
        assert p.calls == [("failure", "handle-f-1", "exit_137")]  # once, not per poll
        with pytest.raises(Unavailable, match="failed"), p.busy(a.id):
            pass
        clock.advance(5.0)
        assert p.metering().instances[a.id].alive_s == pytest.approx(2.0)  # billed until it failed
        assert p.reap() == [a.id]
        assert p.calls[-1] == ("drop", "handle-f-1")
        p.stop(b.id)  # live when stopped: the backend may count an exit it missed
        assert p.calls[-1] == ("terminate", "handle-f-2", 2.0, True)


def test_shutdown_stops_all_once_and_closes(clock):
    p = MemoryBackend(clock)
    p.launch(spec()), p.launch(spec())
    p.shutdown()
    p.shutdown()  # idempotent
    assert sorted(c for c in p.calls if c[0] == "terminate") == [
        ("terminate", "handle-f-1", 2.0, False),
        ("terminate", "handle-f-2", 2.0, False),
    ]
    assert p.calls[-1] == ("close",) and p.calls.count(("close",)) == 1
    assert p.instances() == []
    with pytest.raises(Unavailable, match="shut down"):
        p.launch(spec())

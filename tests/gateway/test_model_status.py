"""``gnn-faas status``'s cache rows: per instance where instances have their own
URL, never through a platform URL that a router spreads over replicas."""

from __future__ import annotations

from types import SimpleNamespace

from gnn_faas.gateway.model_status import REPLICA_CACHE_NOTE, cache_stats
from gnn_faas.scheduler.platform.local import LocalPlatform
from gnn_faas.scheduler.platform.replica_slots import ReplicaSlotPlatform


class Clients:
    def __init__(self):
        self.asked: list[str] = []

    def memory(self, url: str):
        self.asked.append(url)
        return SimpleNamespace(stats=lambda: {"cache": {"hit_rate": 0.5}, "bytes_read": 7})


def runtime(platform_cls, urls: list[str]) -> SimpleNamespace:
    insts = [SimpleNamespace(id=f"m{i}", url=u) for i, u in enumerate(urls)]
    clients = Clients()
    return SimpleNamespace(
        platform=SimpleNamespace(addresses_instances=platform_cls.addresses_instances),
        memory_pool=SimpleNamespace(instances=lambda: insts),
        orchestrator=SimpleNamespace(clients=clients),
    )


def test_instances_with_their_own_url_are_asked_each():
    rt = runtime(LocalPlatform, ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    rows = cache_stats(rt)
    assert rt.orchestrator.clients.asked == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert [r["instance"] for r in rows] == ["m0", "m1"]
    assert all(r["hit_rate"] == 0.5 and r["bytes_read"] == 7 for r in rows)


def test_slots_behind_one_url_are_never_called():
    rt = runtime(ReplicaSlotPlatform, ["http://svc.ns", "http://svc.ns"])
    assert cache_stats(rt) == [{"note": REPLICA_CACHE_NOTE}]
    assert rt.orchestrator.clients.asked == []

"""The knative backend without a cluster: waking a Service at zero, errors
(unreachable API, bad config), quantities. Against a real API server:
test_knative_platform.py and tests/charts/test_chart_install.py."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml

from gnn_faas.config import KnativeSettings
from gnn_faas.scheduler.platform import open_platform
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.knative import KnativePlatform, parse_quantity
from gnn_faas.scheduler.platform.replica_slots import FunctionView, PlatformAPIError, Replica
from tests.servers import free_port

SPEC = FunctionSpec("m-memory", "memory", (), 256)


def kubeconfig(tmp_path, server: str) -> str:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_unreachable_api_is_a_clear_error_and_status_shows_it(tmp_path, caplog):
    cfg = kubeconfig(tmp_path, f"https://127.0.0.1:{free_port()}")
    p = open_platform(
        "knative",
        settings=KnativeSettings("ns", "app=x", cfg, refresh_s=0, start_timeout_s=0.3),
        reaper_interval_s=None,
    )
    with pytest.raises(PlatformAPIError, match="unreachable to list services.serving.knative.dev"):
        p.launch(SPEC)
    row = p.replicas(SPEC.name)
    assert "unreachable" in row["error"] and row["ready"] == 0
    assert any("unreachable" in r.getMessage() for r in caplog.records)
    p.shutdown()


def test_missing_kubeconfig(tmp_path):
    with pytest.raises(PlatformAPIError, match="no Kubernetes configuration"):
        open_platform("knative", settings=KnativeSettings(kubeconfig=str(tmp_path / "none")))


@pytest.mark.parametrize(
    "value, unit, expected",
    [("512Mi", "mem", 512), ("1Gi", "mem", 1024), ("1500m", "cpu", 1.5), ("2", "cpu", 2.0),
     (1, "cpu", 1.0), (None, "cpu", None)],
)  # fmt: skip
def test_parse_quantity(value, unit, expected):
    assert parse_quantity(value, unit) == expected


class _Zero(KnativePlatform):
    """Knative's view scripted by the test: a Service at zero until ``scaled``."""

    def __init__(self, url, **kw):
        super().__init__(api_client=object(), **kw)
        self.url, self.scaled = url, threading.Event()

    def observe(self, spec):
        ready = (
            [Replica("pod-1", True, time.time() - 2, time.time() - 1)]
            if self.scaled.is_set()
            else []
        )
        return FunctionView("ksvc/f", self.url, True, ready, desired=len(ready), actual=len(ready))


def test_a_service_at_zero_is_woken_through_its_url():
    """No ready replica: one request through the Service URL (the activator
    scales from zero); the slot is granted when Knative reports a ready pod."""
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            p.scaled.set()  # the activator made Knative scale from zero
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        p = _Zero(url, settings=KnativeSettings(refresh_s=0, start_timeout_s=5))
        inst = p.launch(SPEC)
        assert hits == ["/v2/health/ready"]
        assert inst.url == url and inst.id.startswith("m-memory/pod-1/")
        rep = p.replicas(SPEC.name)
        assert (rep["desired"], rep["actual"], rep["ready"], rep["slots"]) == (1, 1, 1, 1)
        # billed from the pod's creation, two seconds before it was seen
        assert p.metering().functions[SPEC.name].alive_s >= 1.9
        p.shutdown()
    finally:
        server.shutdown()

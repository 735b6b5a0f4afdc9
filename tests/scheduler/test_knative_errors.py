"""The knative backend's errors without a cluster: unreachable API, bad config."""

from __future__ import annotations

import pytest
import yaml

from gnn_faas.config import KnativeSettings
from gnn_faas.scheduler.platform import open_platform
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.knative import parse_quantity
from gnn_faas.scheduler.platform.replica_slots import PlatformAPIError
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

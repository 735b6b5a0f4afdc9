"""The Grafana dashboard: a well-formed dashboard whose queries parse to the
metric names they use, the ConfigMap that ships it and the PodMonitor that
scrapes the functions (both off by default).

That every name exists in a running stack's ``/metrics`` is checked by
``tests/gateway/test_observability_e2e.py``.
"""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.charts.dashboard import (
    DASHBOARD,
    expressions,
    load,
    metric_names,
    panels,
    sample_names,
)
from tests.kube import CHART, helm, render

K8S_VERSION = "1.35.0"


def test_metric_names_are_read_out_of_promql():
    expr = (
        "histogram_quantile(0.99, sum by (le, model) (rate(gnn_faas_request_seconds_bucket"
        '{model=~"$model", stage!="by (x)"}[$__rate_interval]))) / on (model) group_left '
        "sum without (job) (increase(gnn_faas_requests_total[5m] offset 1h)) * 2.5e3 "
        "and process_open_fds > bool 0"
    )
    assert metric_names(expr) == {
        "gnn_faas_request_seconds_bucket",
        "gnn_faas_requests_total",
        "process_open_fds",
    }
    assert metric_names("max_over_time(up[1h:5m])") == {"up"}
    text = '# HELP a_total x\n# TYPE a counter\na_total{l="1"} 2.0\nb 1\n\nc_bucket{le="+Inf"} 3'
    assert sample_names(text) == {"a_total", "b", "c_bucket"}


def test_the_dashboard_is_well_formed():
    dash = load()
    assert dash["uid"] == "gnn-faas" and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    boxes = []
    for p in panels(dash):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not any(cells & b for b in boxes), f"{p['title']!r} overlaps another panel"
        boxes.append(cells)
        if p["type"] != "row":
            assert p["targets"] and p["description"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
    exprs = list(expressions(dash))
    assert len(exprs) >= 30
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        # Prometheus conventions: a counter is read through rate/increase, never raw
        for name in names:
            if name.endswith("_total") and "panel" in where:
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"{where}: raw {name}"
    used = set().union(*(metric_names(e) for _, e in exprs))
    for family in ("gnn_faas_cache_hits_total", "gnn_faas_storage_read_bytes_total",
                   "gnn_faas_storage_requests_total", "process_resident_memory_bytes",
                   "gnn_faas_function_allocated_memory_byte_seconds_total"):  # fmt: skip
        assert family in used


def test_the_configmap_is_off_by_default_and_ships_the_file_for_the_sidecar():
    assert not [
        o for o in render() if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    ]
    values = {
        "dashboard": {
            "enabled": True,
            "label": "grafana_dashboard",
            "labelValue": "yes",
            "namespace": "monitoring",
            "annotations": {"grafana_folder": "gnn-faas"},
        }
    }
    (cm,) = [o for o in render(values) if o["metadata"]["name"].endswith("-dashboard")]
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    meta = cm["metadata"]
    assert meta["namespace"] == "monitoring" and meta["labels"]["grafana_dashboard"] == "yes"
    assert meta["annotations"] == {"grafana_folder": "gnn-faas"}
    assert meta["labels"]["app.kubernetes.io/part-of"] == "gnn-faas"
    assert json.loads(cm["data"]["gnn-faas.json"]) == load()
    lint = helm("lint", "--strict", str(CHART), "--set", "dashboard.enabled=true")
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout, lint.stdout


@pytest.mark.parametrize(
    "dashboard",
    [
        {"enabled": "yes"},
        {"label": "bad label!"},
        {"labelValue": "-1"},
        {"namespace": "Monitoring"},
        {"annotations": {"a": 1}},
        {"sidecar": True},
        {"podMonitor": {"interval": "soon"}},
        {"podMonitor": {"labels": {"a": 1}}},
        {"podMonitor": {"port": 9090}},
    ],
)
def test_the_schema_rejects_bad_dashboard_values(dashboard):
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)  # the defaults pass
    if "podMonitor" in dashboard:
        values["functionsPodMonitor"].update(dashboard["podMonitor"])
    else:
        values["dashboard"] = {**values["dashboard"], **dashboard}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, schema)


def _matches(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In"
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _pod_labels(obj: dict) -> dict:
    if obj["kind"] == "Service" and obj["apiVersion"].startswith("serving.knative.dev"):
        return obj["spec"]["template"]["metadata"]["labels"]
    if obj["kind"] == "Function":  # OpenFaaS puts the Function's labels on its pods
        return obj["spec"]["labels"]
    return obj["spec"]["template"]["metadata"]["labels"]  # the gateway Deployment


@pytest.mark.parametrize(("platform", "port"), [("knative", "user-port"), ("openfaas", 8080)])
def test_the_pod_monitor_selects_every_function_pod_and_not_the_gateway(platform, port):
    assert not [o for o in render({"platform": platform}) if o["kind"] == "PodMonitor"]
    values = {
        "platform": platform,
        "openfaas": {"functionNamespace": "fns"},
        "functionsPodMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
    }
    objs = render(values, ns="ml")
    (pm,) = [o for o in objs if o["kind"] == "PodMonitor"]
    assert (
        pm["apiVersion"] == "monitoring.coreos.com/v1"
        and pm["metadata"]["labels"]["release"] == "kps"
    )
    spec = pm["spec"]
    assert set(spec) == {"selector", "namespaceSelector", "podMetricsEndpoints"}
    assert spec["namespaceSelector"]["matchNames"] == ["fns" if platform == "openfaas" else "ml"]
    (endpoint,) = spec["podMetricsEndpoints"]
    key = "targetPort" if platform == "openfaas" else "port"
    assert endpoint == {key: port, "path": "/metrics", "interval": "15s"}
    functions = [
        o
        for o in objs
        if o["kind"] in ("Service", "Function")
        and "gnn-faas.io/function-kind" in o["metadata"]["labels"]
    ]
    assert len(functions) == 2
    assert all(_matches(spec["selector"], _pod_labels(f)) for f in functions)
    (gateway,) = [o for o in objs if o["kind"] == "Deployment"]
    assert not _matches(spec["selector"], _pod_labels(gateway))
    lint = helm("lint", "--strict", str(CHART), "--set", "functionsPodMonitor.enabled=true")
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout, lint.stdout


@pytest.mark.slow
def test_the_dashboard_configmap_installs_into_a_real_api_server():
    """helm install with the dashboard on: the API server takes the ConfigMap
    (in another namespace than the release's), with the sidecar's label and the
    dashboard byte for byte."""
    from tests.kube import cluster

    c = cluster()
    for ns in ("dash", "monitoring"):
        c.kubectl("create", "namespace", ns)
    r = c.helm(
        "install", "dash", str(CHART), "-n", "dash",
        "--set", "dashboard.enabled=true", "--set", "dashboard.namespace=monitoring",
    )  # fmt: skip
    assert "STATUS: deployed" in r.stdout, r.stdout
    try:
        got = c.get_json("configmap", "dash-gnn-faas-dashboard", "-n", "monitoring")
        assert got["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert got["data"]["gnn-faas.json"] == DASHBOARD.read_text().rstrip("\n")
    finally:
        c.helm("uninstall", "dash", "-n", "dash")

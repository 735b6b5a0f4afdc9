"""Rules Knative's admission webhook enforces on a Service beyond its CRD schema.

No Knative controller or webhook runs in the tests, so the rules of
knative.dev/serving ``pkg/apis/serving/k8s_validation.go`` that a rendered
Service could break are checked here: volume mounts never at a reserved path
(``/``, ``/dev``, ``/dev/log``, ``/tmp``, ``/var``, ``/var/log``), unique and
absolute, every volume mounted; no reserved variable (``PORT``, ``K_SERVICE``,
``K_CONFIGURATION``, ``K_REVISION``); one serving container with at most one
port, named ``http1``, ``h2c`` or nothing; probes with one handler and, when
``periodSeconds`` > 0, ``timeoutSeconds`` and ``failureThreshold`` >= 1; no
container named ``queue-proxy``; no init containers, ``nodeSelector`` or
``tolerations`` unless the feature flag is on (``config-features``:
``kubernetes.podspec-init-containers`` and friends, all off in stock Knative).
And the autoscaling annotations as ``pkg/apis/autoscaling`` validates them:
``min-scale`` <= ``max-scale``, ``initial-scale`` >= 1 unless
``allow-zero-initial-scale``, ``target`` >= 0.01, ``target-utilization-percentage``
in 1..100, ``window`` in 6s..1h, ``scale-to-zero-pod-retention-period`` in
0..1h. :func:`knative_errors` lists what is broken.
"""

from __future__ import annotations

import posixpath
import re

RESERVED_PATHS = {"/", "/dev", "/dev/log", "/tmp", "/var", "/var/log"}
RESERVED_ENV = {"PORT", "K_SERVICE", "K_CONFIGURATION", "K_REVISION"}
PORT_NAMES = {None, "", "http1", "h2c"}


def _probe_errors(probe: dict | None, where: str, readiness: bool) -> list[str]:
    if probe is None:
        return []
    errs = []
    handlers = [h for h in ("httpGet", "tcpSocket", "exec", "grpc") if h in probe]
    if len(handlers) != 1:
        errs.append(f"{where}: exactly one handler, got {handlers}")
    if readiness and probe.get("periodSeconds", 0) > 0:
        for key in ("timeoutSeconds", "failureThreshold"):
            if probe.get(key, 0) < 1:
                errs.append(f"{where}.{key}: must be >= 1 when periodSeconds > 0")
    return errs


STOCK_FEATURES = frozenset()  # config-features flags a stock install has on (none of these)
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(value: str) -> float | None:
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", value)
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def _annotation_errors(ann: dict, allow_zero_initial_scale: bool) -> list[str]:
    errs = []
    a = {k.removeprefix("autoscaling.knative.dev/"): v for k, v in ann.items()}
    lo, hi = int(a.get("min-scale", 0)), int(a.get("max-scale", 0))
    if hi and lo > hi:
        errs.append(f"min-scale {lo} > max-scale {hi}")
    if "initial-scale" in a and int(a["initial-scale"]) < 1 and not allow_zero_initial_scale:
        errs.append("initial-scale 0 needs allow-zero-initial-scale")
    if "target" in a and float(a["target"]) < 0.01:
        errs.append(f"target {a['target']} < 0.01")
    util = a.get("target-utilization-percentage")
    if util is not None and not 1 <= float(util) <= 100:
        errs.append(f"target-utilization-percentage {util} outside 1..100")
    if "window" in a:
        w = _seconds(a["window"])
        if w is None or not 6 <= w <= 3600:
            errs.append(f"window {a['window']} outside 6s..1h")
    if "scale-to-zero-pod-retention-period" in a:
        r = _seconds(a["scale-to-zero-pod-retention-period"])
        if r is None or not 0 <= r <= 3600:
            errs.append(
                f"scale-to-zero-pod-retention-period {a['scale-to-zero-pod-retention-period']} outside 0..1h"
            )
    return errs


def knative_errors(
    ksvc: dict, features: frozenset[str] = STOCK_FEATURES, allow_zero_initial_scale=False
) -> list[str]:
    spec = ksvc["spec"]["template"]["spec"]
    volumes = {v["name"] for v in spec.get("volumes", [])}
    containers = spec["containers"]
    errs = _annotation_errors(
        ksvc["spec"]["template"].get("metadata", {}).get("annotations", {}),
        allow_zero_initial_scale,
    )
    for field, flag in (
        ("initContainers", "kubernetes.podspec-init-containers"),
        ("nodeSelector", "kubernetes.podspec-nodeselector"),
        ("tolerations", "kubernetes.podspec-tolerations"),
    ):
        if spec.get(field) and flag not in features:
            errs.append(f"{field}: needs the Knative feature flag {flag}")
    if len(containers) != 1:
        errs.append(f"containers: one serving container expected, got {len(containers)}")
    mounted = set()
    for kind, group in (
        ("containers", containers),
        ("initContainers", spec.get("initContainers", [])),
    ):
        for i, c in enumerate(group):
            where = f"{kind}[{i}]"
            if c.get("name") == "queue-proxy":
                errs.append(f"{where}.name: queue-proxy is reserved")
            for e in c.get("env", []):
                if e["name"] in RESERVED_ENV:
                    errs.append(f"{where}.env: {e['name']} is a reserved variable")
            seen = set()
            for m in c.get("volumeMounts", []):
                path = posixpath.normpath(m["mountPath"])
                if path in RESERVED_PATHS:
                    errs.append(f"{where}.volumeMounts: mountPath {path!r} is a reserved path")
                if not path.startswith("/"):
                    errs.append(f"{where}.volumeMounts: mountPath {path!r} is not absolute")
                if path in seen:
                    errs.append(f"{where}.volumeMounts: {path!r} must be unique")
                if m["name"] not in volumes:
                    errs.append(f"{where}.volumeMounts: {m['name']!r} has no matching volume")
                seen.add(path)
                mounted.add(m["name"])
            if kind == "containers":
                ports = c.get("ports", [])
                if len(ports) > 1:
                    errs.append(f"{where}.ports: only a single port is allowed")
                if ports and ports[0].get("name") not in PORT_NAMES:
                    errs.append(f"{where}.ports: name must be empty, http1 or h2c")
                errs += _probe_errors(c.get("readinessProbe"), f"{where}.readinessProbe", True)
                errs += _probe_errors(c.get("livenessProbe"), f"{where}.livenessProbe", False)
    if volumes - mounted:
        errs.append(f"volumes not mounted: {sorted(volumes - mounted)}")
    return errs

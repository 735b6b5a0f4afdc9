"""Rules Knative's admission webhook enforces on a Service beyond its CRD schema.

No Knative controller or webhook runs in the tests, so the rules of
knative.dev/serving ``pkg/apis/serving/k8s_validation.go`` that a rendered
Service could break are checked here: volume mounts never at a reserved path
(``/``, ``/dev``, ``/dev/log``, ``/tmp``, ``/var``, ``/var/log``), unique and
absolute, every volume mounted; no reserved variable (``PORT``, ``K_SERVICE``,
``K_CONFIGURATION``, ``K_REVISION``); one serving container with at most one
port, named ``http1``, ``h2c`` or nothing; probes with one handler and, when
``periodSeconds`` > 0, ``timeoutSeconds`` and ``failureThreshold`` >= 1; no
container named ``queue-proxy``. :func:`knative_errors` lists what is broken.
"""

from __future__ import annotations

import posixpath

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


def knative_errors(ksvc: dict) -> list[str]:
    spec = ksvc["spec"]["template"]["spec"]
    volumes = {v["name"] for v in spec.get("volumes", [])}
    containers = spec["containers"]
    errs = []
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

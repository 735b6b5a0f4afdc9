"""The openfaas platform: functions behind an OpenFaaS gateway's REST API.

Endpoints (basic auth on ``/system/*``): ``GET /system/functions[?namespace=NS]``
(the gateway finds its function by the label ``gnn-faas.io/function=MODEL-KIND``
plus the release's selector), ``GET /system/function/NAME``, ``POST
/system/functions`` (:meth:`OpenFaaSPlatform.deploy`), ``POST
/system/scale-function/NAME``, and ``POST /function/NAME[.NAMESPACE]/...`` to
invoke (no auth). Basic auth comes from ``$user_env``/``$password_env``, else from
the Kubernetes Secret ``credentials_secret`` (kube_client.py).

Replicas are OpenFaaS's ``availableReplicas`` (replica ``i`` is named ``NAME-i``;
the API lists no pods), billed from when the gateway first saw one until the count
dropped below it. By default OpenFaaS's autoscaler owns the count and the gateway
bounds its calls by available replicas x the function's concurrency (its
``com.openfaas.scale.target`` label, else ``concurrency``); a launch that finds a
function at zero asks for one replica (nothing else would wake it). With
``gateway_scaling`` the gateway drives the count with the pools' launch rule
(docs/design/launch-and-reap.md): :meth:`want_replicas` posts ``replicas =
ceil((slots + 1) / concurrency)`` on a launch and ``ceil(slots / concurrency)``
as slots expire. 401, 404 and 5xx answers become :class:`PlatformAPIError`
messages that say which. The full description: docs/design/openfaas-platform.md.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import requests

from gnn_faas.clock import Clock
from gnn_faas.config import OpenFaaSSettings
from gnn_faas.errors import NotFound
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.knative import parse_quantity
from gnn_faas.scheduler.platform.replica_slots import (
    FunctionView,
    PlatformAPIError,
    Replica,
    ReplicaSlotPlatform,
)

log = logging.getLogger(__name__)
FUNCTION_LABEL = "gnn-faas.io/function"


def _selector_labels(selector: str) -> dict[str, str]:
    """``"a=b,c=d"`` -> ``{"a": "b", "c": "d"}`` (equality selectors only)."""
    out = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


class OpenFaaSPlatform(ReplicaSlotPlatform):
    """Function slots on the replicas of OpenFaaS functions."""

    name = "openfaas"

    def __init__(
        self,
        clock: Clock | None = None,
        settings: OpenFaaSSettings | None = None,
        reaper_interval_s: float | None = None,
        session: requests.Session | None = None,
        **kwargs: Any,
    ):
        self.settings = settings or OpenFaaSSettings()
        super().__init__(
            clock,
            refresh_s=self.settings.refresh_s,
            start_timeout_s=self.settings.start_timeout_s,
            **kwargs,
        )
        self.base = self.settings.url.rstrip("/")
        self.session = session or requests.Session()
        user = os.environ.get(self.settings.user_env)
        password = os.environ.get(self.settings.password_env)
        if user and password:
            self.session.auth = (user, password)
        elif self.settings.credentials_secret:
            from gnn_faas.scheduler.platform.kube_client import read_basic_auth

            self.session.auth = read_basic_auth(
                self.settings.credentials_secret,
                self.settings.user_key,
                self.settings.password_key,
                self.settings.kubeconfig,
            )
        self._names: dict[str, str] = {}
        self._asked: dict[str, int] = {}  # replicas last asked for, per function
        self._scale_lock = threading.Lock()

    # -- REST with clear errors ----------------------------------------------------
    def _request(self, method: str, path: str, what: str, **kw) -> requests.Response:
        params = kw.pop("params", {})
        if self.settings.namespace:
            params = {**params, "namespace": self.settings.namespace}
        try:
            r = self.session.request(method, self.base + path, params=params, timeout=10, **kw)
        except requests.RequestException as exc:
            raise PlatformAPIError(
                f"the OpenFaaS gateway at {self.base} is unreachable to {what} "
                f"({type(exc).__name__})"
            ) from None
        if r.status_code == 401:
            raise PlatformAPIError(
                f"the OpenFaaS gateway refused the credentials to {what} (401): check the "
                f"basic-auth Secret (${self.settings.user_env}/${self.settings.password_env})"
            )
        if r.status_code == 403:
            raise PlatformAPIError(f"the OpenFaaS gateway forbids the gateway to {what} (403)")
        if r.status_code == 404:
            raise NotFound(f"OpenFaaS: {what}: not found (404): {r.text.strip()[:200]}")
        if r.status_code >= 400:
            raise PlatformAPIError(
                f"the OpenFaaS gateway failed to {what} ({r.status_code}: {r.text.strip()[:200]})"
            )
        return r

    # -- functions -------------------------------------------------------------------
    def function_name(self, spec: FunctionSpec) -> str:
        """The OpenFaaS name of ``spec``'s function, found by its labels."""
        name = self._names.get(spec.name)
        if name is not None:
            return name
        want = {**_selector_labels(self.settings.selector), FUNCTION_LABEL: spec.name}
        listed = self._request("GET", "/system/functions", "list functions").json() or []
        matches = [
            f["name"]
            for f in listed
            if all((f.get("labels") or {}).get(k) == v for k, v in want.items())
        ]
        if not matches:
            raise NotFound(f"no OpenFaaS function with labels {want}")
        if len(matches) > 1:
            raise PlatformAPIError(f"labels {want} match several OpenFaaS functions: {matches}")
        self._names[spec.name] = matches[0]
        return matches[0]

    def deploy(
        self,
        spec: FunctionSpec,
        image: str,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        """Deploy ``spec`` as OpenFaaS function ``name`` (default: ``spec.name``)
        from ``image``, with its memory and vCPUs as limits and requests."""
        name = name or spec.name
        resources = {"memory": f"{spec.memory_mb}Mi", "cpu": f"{int(spec.vcpus * 1000)}m"}
        body = {
            "service": name,
            "image": image,
            "envVars": {**dict(spec.env), **(env or {})},
            "labels": {
                **_selector_labels(self.settings.selector),
                **(labels or {}),
                FUNCTION_LABEL: spec.name,
                "gnn-faas.io/function-kind": spec.kind,
            },
            "limits": resources,
            "requests": resources,
            "readOnlyRootFilesystem": True,
        }
        if self.settings.namespace:
            body["namespace"] = self.settings.namespace
        self._request("POST", "/system/functions", f"deploy {name}", json=body)
        self._names[spec.name] = name
        return name

    def observe(self, spec: FunctionSpec) -> FunctionView:
        name = self.function_name(spec)
        try:
            f = self._request("GET", f"/system/function/{name}", f"read function {name}").json()
        except NotFound:
            self._names.pop(spec.name, None)  # redeployed under another name?
            raise
        available = int(f.get("availableReplicas") or 0)
        replicas = [Replica(f"{name}-{i}", True) for i in range(available)]
        req = f.get("requests") or f.get("limits") or {}
        ns = self.settings.namespace
        target = (f.get("labels") or {}).get("com.openfaas.scale.target")
        concurrency = int(target) if target and target.isdigit() else self.settings.concurrency
        return FunctionView(
            resource=f"function/{name}",
            url=f"{self.base}/function/{name}.{ns}" if ns else f"{self.base}/function/{name}",
            ready=available > 0,
            replicas=replicas,
            desired=f.get("replicas"),
            actual=available,
            concurrency=max(1, int(concurrency)),
            memory_mb=parse_quantity(req.get("memory"), "mem") if req.get("memory") else None,
            vcpus=parse_quantity(req.get("cpu"), "cpu") if req.get("cpu") else None,
        )

    def scale(self, spec: FunctionSpec, replicas: int) -> None:
        """Ask OpenFaaS for ``replicas`` replicas of ``spec``'s function."""
        name = self.function_name(spec)
        self._request(
            "POST",
            f"/system/scale-function/{name}",
            f"scale {name} to {replicas}",
            json={"serviceName": name, "replicas": int(replicas)},
        )
        log.info("openfaas: scaled %s to %d replicas", name, replicas)

    # -- launch rule ------------------------------------------------------------------
    def want_replicas(self, spec: FunctionSpec, view: FunctionView, slots: int) -> None:
        if self.settings.gateway_scaling:
            self._scale_for(spec, view, slots, up=True)
        elif not view.desired and not view.actual:
            self._wake(spec)

    def _wake(self, spec: FunctionSpec) -> None:
        """Ask for one replica of a function at zero (once per zero spell: the
        next views show ``replicas`` 1)."""
        with self._scale_lock:
            try:
                self.scale(spec, 1)
            except (PlatformAPIError, NotFound) as exc:
                log.error("openfaas: waking %s: %s", spec.name, exc)

    def release_replicas(self, spec: FunctionSpec, view: FunctionView, slots: int) -> None:
        if self.settings.gateway_scaling:
            self._scale_for(spec, view, slots, up=False)

    def _scale_for(self, spec: FunctionSpec, view: FunctionView, slots: int, up: bool) -> None:
        """``replicas = ceil(slots / concurrency)``, only upwards on a launch and
        only downwards on a release; one request at a time per platform, against
        the count last asked for (the view may be a moment old)."""
        need = math.ceil(slots / view.concurrency)
        with self._scale_lock:
            current = self._asked.get(spec.name, view.desired or 0)
            if (up and need <= current) or (not up and need >= current):
                return
            try:
                self.scale(spec, need)
            except (PlatformAPIError, NotFound) as exc:
                log.error("openfaas: %s", exc)
                return
            self._asked[spec.name] = need

    def shutdown(self) -> None:
        super().shutdown()
        self.session.close()

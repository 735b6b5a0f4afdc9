"""The knative platform: the functions the chart deployed as Knative Services.

The gateway finds each function's Service by label (``gnn-faas.io/function=
MODEL-KIND`` plus the release's selector, e.g. ``app.kubernetes.io/instance=
gnn-faas``), reads its URL, readiness and latest ready revision, lists that
revision's pods (``serving.knative.dev/revision=REV``) as the replicas, reads
the revision's PodAutoscaler for the desired and actual scale, and dispatches
every call to the Service URL. Knative's autoscaler owns the replica count:
the gateway only bounds its calls in flight by ready replicas x
``containerConcurrency`` (replica_slots.py) and queues the rest in its
load-aware queue. A Service at zero replicas is woken by one request through
its URL (the activator holds it and scales from zero), the way any Knative
client wakes it.

Reads only, with the ServiceAccount the chart binds (``get``/``list`` on
services.serving.knative.dev, podautoscalers.autoscaling.internal.knative.dev
and pods): nothing here writes to the cluster. A 401/403 or an unreachable
API is a :class:`PlatformAPIError` naming the verb and resource.
"""

from __future__ import annotations

import calendar
import logging
import threading
import time
from typing import Any

from gnn_faas.clock import Clock
from gnn_faas.config import KnativeSettings
from gnn_faas.errors import MissingExtra, NotFound
from gnn_faas.health import probe_ready
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.scheduler.platform.replica_slots import (
    FunctionView,
    PlatformAPIError,
    Replica,
    ReplicaSlotPlatform,
)

log = logging.getLogger(__name__)

SERVING = ("serving.knative.dev", "v1", "services")
AUTOSCALING = ("autoscaling.internal.knative.dev", "v1alpha1", "podautoscalers")
FUNCTION_LABEL = "gnn-faas.io/function"
REVISION_LABEL = "serving.knative.dev/revision"


def parse_quantity(value: Any, unit: str) -> float | None:
    """A Kubernetes quantity in MiB (``unit="mem"``) or cores (``unit="cpu"``)."""
    if value is None:
        return None
    s = str(value)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    if unit == "cpu":
        return float(s[:-1]) / 1000 if s.endswith("m") else float(s)
    for suf, mult in suffixes.items():
        if s.endswith(suf):
            return float(s[: -len(suf)]) * mult / 2**20
    return float(s) / 2**20


def _ts(value: Any) -> float | None:
    """Wall seconds of a Kubernetes timestamp (datetime or RFC 3339 string)."""
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return float(calendar.timegm(time.strptime(str(value)[:19], "%Y-%m-%dT%H:%M:%S")))


def _condition(obj: dict, kind: str = "Ready") -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


class KnativePlatform(ReplicaSlotPlatform):
    """Function slots on the replicas of the chart's Knative Services."""

    name = "knative"

    def __init__(
        self,
        clock: Clock | None = None,
        settings: KnativeSettings | None = None,
        reaper_interval_s: float | None = None,  # Knative scales in itself
        api_client: Any = None,
        **kwargs: Any,
    ):
        self.settings = settings or KnativeSettings()
        super().__init__(
            clock,
            refresh_s=self.settings.refresh_s,
            start_timeout_s=self.settings.start_timeout_s,
            **kwargs,
        )
        try:
            from kubernetes import client
        except ImportError:
            raise MissingExtra("the knative platform", "kubernetes", "kubernetes") from None
        self._client = client
        self.api = api_client or self._api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self._woken: dict[str, float] = {}

    def _api_client(self):
        from gnn_faas.scheduler.platform.kube_client import api_client

        return api_client(self.settings.kubeconfig)

    # -- API calls with clear errors ---------------------------------------------
    def _call(self, what: str, fn, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        ns = self.settings.namespace
        try:
            return fn(*args, _request_timeout=10, **kwargs)
        except ApiException as exc:
            if exc.status == 401:
                raise PlatformAPIError(
                    f"the Kubernetes API refused the gateway's credentials (401) to {what}"
                ) from None
            if exc.status == 403:
                raise PlatformAPIError(
                    f"the Kubernetes API forbids the gateway's ServiceAccount to {what} in "
                    f"namespace {ns} (403): grant it in the chart's Role"
                ) from None
            if exc.status == 404:
                raise NotFound(f"{what}: not found (404; are Knative's CRDs installed?)") from None
            raise PlatformAPIError(
                f"the Kubernetes API failed to {what} ({exc.status}: {exc.reason})"
            ) from None
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise PlatformAPIError(
                f"the Kubernetes API is unreachable to {what} ({type(exc).__name__}: {exc})"
            ) from None

    def _selector(self, spec: FunctionSpec) -> str:
        parts = [p for p in (self.settings.selector, f"{FUNCTION_LABEL}={spec.name}") if p]
        return ",".join(parts)

    # -- the hook ------------------------------------------------------------------
    def observe(self, spec: FunctionSpec) -> FunctionView:
        ns = self.settings.namespace
        group, version, plural = SERVING
        selector = self._selector(spec)
        found = self._call(
            "list services.serving.knative.dev",
            self.custom.list_namespaced_custom_object,
            group,
            version,
            ns,
            plural,
            label_selector=selector,
        )["items"]
        if not found:
            raise NotFound(f"no Knative Service in namespace {ns} with labels {selector}")
        if len(found) > 1:
            names = sorted(s["metadata"]["name"] for s in found)
            raise PlatformAPIError(f"labels {selector} match several Knative Services: {names}")
        svc = found[0]
        status = svc.get("status") or {}
        revision = status.get("latestReadyRevisionName")
        pod_spec = ((svc.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = pod_spec.get("containers") or [{}]
        requests = (containers[0].get("resources") or {}).get("requests") or {}
        cond = _condition(svc)
        view = FunctionView(
            resource=f"ksvc/{svc['metadata']['name']}",
            url=status.get("url"),
            ready=bool(cond and cond.get("status") == "True"),
            revision=revision,
            concurrency=int(pod_spec.get("containerConcurrency") or 1),
            memory_mb=parse_quantity(requests.get("memory"), "mem"),
            vcpus=parse_quantity(requests.get("cpu"), "cpu"),
        )
        if revision is None:
            return view
        pods = self._call(
            "list pods",
            self.core.list_namespaced_pod,
            ns,
            label_selector=f"{REVISION_LABEL}={revision}",
        ).items
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue
            ready_at = None
            ready = False
            for c in (pod.status.conditions if pod.status else None) or []:
                if c.type == "Ready" and c.status == "True":
                    ready, ready_at = True, _ts(c.last_transition_time)
            view.replicas.append(
                Replica(pod.metadata.name, ready, _ts(pod.metadata.creation_timestamp), ready_at)
            )
        group, version, plural = AUTOSCALING
        try:
            pa = self._call(
                "get podautoscalers.autoscaling.internal.knative.dev",
                self.custom.get_namespaced_custom_object,
                group,
                version,
                ns,
                plural,
                revision,
            )
        except NotFound:
            pa = None  # a revision's PodAutoscaler comes a moment after it
        if pa is not None:
            st = pa.get("status") or {}
            view.desired, view.actual = st.get("desiredScale"), st.get("actualScale")
        return view

    def want_replicas(self, spec: FunctionSpec, view: FunctionView, slots: int) -> None:
        """At zero ready replicas, wake the Service through its URL (the
        activator scales it from zero); otherwise Knative's autoscaler sees the
        saturated replicas (target below containerConcurrency) and adds more."""
        if not view.url or any(r.ready for r in view.replicas):
            return
        last = self._woken.get(spec.name, float("-inf"))
        if time.monotonic() - last < self.start_timeout_s:
            return
        self._woken[spec.name] = time.monotonic()
        log.info("knative: waking %s from zero through %s", spec.name, view.url)
        threading.Thread(
            target=probe_ready, args=(view.url, self.start_timeout_s), daemon=True
        ).start()

    def shutdown(self) -> None:
        super().shutdown()
        try:
            self.api.close()
        except Exception:  # the pool may already be gone at interpreter exit
            log.debug("closing the Kubernetes client failed", exc_info=True)

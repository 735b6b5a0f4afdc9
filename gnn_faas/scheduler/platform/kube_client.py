"""A Kubernetes API client for the platform backends, and OpenFaaS's basic-auth Secret.

:func:`api_client` loads the in-cluster configuration inside a pod (the
ServiceAccount's token), else the kubeconfig named (or ``~/.kube/config``).
:func:`read_basic_auth` reads the user and password of OpenFaaS's gateway from
its Secret: OpenFaaS creates ``basic-auth`` in its own namespace, which a Pod of
another namespace cannot mount, so the gateway reads it through the API with a
Role granting ``get`` on that one Secret (the chart's). Errors are
:class:`PlatformAPIError` messages that say what to fix.
"""

from __future__ import annotations

import base64
import os

from gnn_faas.errors import MissingExtra
from gnn_faas.scheduler.platform.replica_slots import PlatformAPIError


def api_client(kubeconfig: str | None):
    """A ``kubernetes.client.ApiClient`` (in-cluster when ``kubeconfig`` is None
    and the process runs in a pod)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise MissingExtra("the Kubernetes API", "kubernetes", "kubernetes") from None
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(config_file=kubeconfig)
    except Exception as exc:  # ConfigException, missing files
        raise PlatformAPIError(f"no Kubernetes configuration: {exc}") from None


def read_basic_auth(
    secret: str, user_key: str, password_key: str, kubeconfig: str | None = None
) -> tuple[str, str]:
    """``(user, password)`` from the Secret ``NAMESPACE/NAME``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ns, sep, name = secret.partition("/")
    if not sep or not ns or not name:
        raise PlatformAPIError(f"credentials_secret must be NAMESPACE/NAME, got {secret!r}")
    api = api_client(kubeconfig)
    try:
        obj = client.CoreV1Api(api).read_namespaced_secret(name, ns, _request_timeout=10)
    except ApiException as exc:
        what = {403: "forbids the gateway's ServiceAccount to read", 404: "has no"}.get(
            exc.status, f"failed ({exc.status}) to read"
        )
        raise PlatformAPIError(
            f"the Kubernetes API {what} the OpenFaaS basic-auth Secret {secret} "
            "(the chart's openfaas.basicAuthNamespace / basicAuthSecret)"
        ) from None
    except Exception as exc:  # urllib3 connection errors, timeouts
        raise PlatformAPIError(
            f"the Kubernetes API is unreachable to read {secret} ({type(exc).__name__})"
        ) from None
    finally:
        api.close()
    data = obj.data or {}
    missing = [k for k in (user_key, password_key) if k not in data]
    if missing:
        raise PlatformAPIError(f"the Secret {secret} has no key(s) {missing}")
    return tuple(base64.b64decode(data[k]).decode() for k in (user_key, password_key))

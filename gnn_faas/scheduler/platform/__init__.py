"""Function platforms: where function instances run.

``open_platform(name, **kwargs)`` imports a backend only when asked for:
``"local"`` (the embedded default: processes on this machine,
:class:`~gnn_faas.scheduler.platform.local.LocalPlatform`); ``"knative"`` and
``"openfaas"`` (the functions the Helm chart deployed, on replicas those
platforms scale: replica_slots.py). A planned backend (``None``) is a clear
error rather than an import failure.
"""

from __future__ import annotations

import importlib
from typing import Any

from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.platform.base import (
    FunctionSpec,
    Instance,
    Platform,
    PlatformNotAvailable,
)
from gnn_faas.scheduler.platform.metering import Meter, MeteringReport, Usage

# name -> "module:Class"; None: planned, not available in this build yet.
PLATFORMS: dict[str, str | None] = {
    "local": "gnn_faas.scheduler.platform.local:LocalPlatform",
    "docker": "gnn_faas.scheduler.platform.docker:DockerPlatform",
    "knative": "gnn_faas.scheduler.platform.knative:KnativePlatform",
    "openfaas": "gnn_faas.scheduler.platform.openfaas:OpenFaaSPlatform",
}

__all__ = [
    "PLATFORMS",
    "FunctionSpec",
    "Instance",
    "Meter",
    "MeteringReport",
    "Platform",
    "PlatformNotAvailable",
    "Usage",
    "open_platform",
]


def open_platform(name: str, **kwargs: Any) -> Platform:
    """A platform backend by name, constructed with ``kwargs``."""
    if name not in PLATFORMS:
        raise InvalidRequest(f"unknown platform {name!r}; choose one of {sorted(PLATFORMS)}")
    target = PLATFORMS[name]
    if target is None:
        raise PlatformNotAvailable(
            f"the {name!r} platform is not available yet; use 'local' "
            "(the embedded platform of local processes)"
        )
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)

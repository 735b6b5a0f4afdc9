"""Registry of storage backends, imported lazily by URI scheme.

``open_backend("file:///data/store")``, ``open_backend("s3://bucket/prefix")``,
``open_backend("redis://localhost:6379/0")``. A backend whose client library is
missing fails with a message naming the pip extra to install.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlparse

from gnn_faas.errors import InvalidRequest, MissingExtra
from gnn_faas.storage.backends.base import StorageBackend

# scheme -> (module, class, pip extra, third-party module it needs)
_REGISTRY: dict[str, tuple[str, str, str | None, str | None]] = {
    "file": ("gnn_faas.storage.backends.file", "FileBackend", None, None),
    "s3": ("gnn_faas.storage.backends.s3", "S3Backend", "s3", "boto3"),
    "redis": ("gnn_faas.storage.backends.redis", "RedisBackend", "redis", "redis"),
}


def known_schemes() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(scheme: str) -> type[StorageBackend]:
    try:
        module, cls, extra, needs = _REGISTRY[scheme]
    except KeyError:
        raise InvalidRequest(
            f"unknown store scheme {scheme!r}; known: {', '.join(known_schemes())}"
        ) from None
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            raise MissingExtra(f"the {scheme}:// store", extra or scheme, needs) from None
    return getattr(importlib.import_module(module), cls)


def open_backend(uri: str) -> StorageBackend:
    """Open the store at ``uri``; a bare path means ``file://``."""
    scheme = urlparse(uri).scheme if "://" in uri else "file"
    return backend_class(scheme)(uri)


__all__ = ["StorageBackend", "backend_class", "known_schemes", "open_backend"]

"""Exceptions shared by every package, each mapped to an HTTP status.

The HTTP layers (gateway, functions) turn these into ``{"error": ...}`` JSON
bodies with ``http_status``; the CLI turns them into a message and exit code 2.
"""

from __future__ import annotations


class GnnFaasError(Exception):
    """Base class. ``http_status`` is the status an HTTP endpoint answers with."""

    http_status = 500


class InvalidRequest(GnnFaasError):
    """Malformed input: bad JSON, wrong dtype or shape, out-of-range ids."""

    http_status = 400


class PayloadTooLarge(InvalidRequest):
    http_status = 413


class NotFound(GnnFaasError):
    """An unknown model, graph or resource."""

    http_status = 404


class StorageError(GnnFaasError):
    """A storage backend failed."""

    http_status = 502


class BlobNotFound(StorageError, NotFound):
    """An object that should exist in the store does not."""

    http_status = 404


class TransientStorageError(StorageError):
    """A failure worth retrying (timeouts, throttling, connection resets)."""

    http_status = 503


class CorruptBlob(StorageError):
    """A blob's size or sha256 does not match the manifest."""

    http_status = 500


class MissingExtra(GnnFaasError):
    """An optional dependency (pip extra) is not installed."""

    def __init__(self, feature: str, extra: str, module: str):
        super().__init__(f"{feature} needs the '{module}' package: pip install 'gnn-faas[{extra}]'")


class Unavailable(GnnFaasError):
    """No instance could serve the request right now."""

    http_status = 503

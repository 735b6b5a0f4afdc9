"""Exceptions shared by every package, each mapped to an HTTP status.

The HTTP layers (gateway, functions) turn these into ``{"error": ...}`` JSON
bodies with ``http_status``; the CLI turns them into a message and exit code 2.

:func:`http_status` is the one mapping from an exception to a status (KServe
style): a :class:`GnnFaasError` carries its own (4xx: the client's fault; 503
with ``Retry-After``: overload or a transient failure; 5xx otherwise); any other
exception that reaches the HTTP layer is a fault of ours, a logged 500.
"""

from __future__ import annotations


class GnnFaasError(Exception):
    """Base class. ``http_status`` is the status an HTTP endpoint answers with."""

    http_status = 500


class InvalidRequest(GnnFaasError):
    """Malformed input: bad JSON, wrong dtype or shape, out-of-range ids."""

    http_status = 400


class PayloadTooLarge(InvalidRequest):
    """A request beyond a configured limit (body bytes, ids per request)."""

    http_status = 413


class UnsupportedRequest(InvalidRequest):
    """A well-formed request the model cannot answer (its task has no such
    request kind, or it has no such output)."""

    http_status = 400


class Unauthorized(GnnFaasError):
    """A write without a bearer token (401, ``WWW-Authenticate: Bearer``)."""

    http_status = 401


class Forbidden(GnnFaasError):
    """A write whose token is wrong, or to a graph no token opens (403)."""

    http_status = 403


class NotFound(GnnFaasError):
    """An unknown model, graph or resource."""

    http_status = 404


class StorageError(GnnFaasError):
    """A storage backend failed."""

    http_status = 502


class BlobNotFound(StorageError, NotFound):
    """An object that should exist in the store does not. Over HTTP a store
    that lost a blob the manifest lists is the store's fault: 500."""

    http_status = 500


class TransientStorageError(StorageError):
    """A failure worth retrying (timeouts, throttling, connection resets)."""

    http_status = 503


class CorruptBlob(StorageError):
    """A blob's size or sha256 does not match the manifest, or its contents
    break the format's invariants (a CSR whose ``indptr`` goes backwards)."""

    http_status = 500


class StoreUnavailable(TransientStorageError):
    """The graph store did not answer in time or refused the call: the
    store's fault, never the client's (503 with ``Retry-After``, named in
    ``X-Gnn-Faas-Failed: store`` between functions and the gateway)."""

    http_status = 503
    retry_after_s: float = 2.0


class GraphOutOfService(GnnFaasError):
    """A model's graph was found corrupt while serving: it is taken out of
    service (503) rather than answered wrongly, until a re-verification of the
    store passes."""

    http_status = 503
    retry_after_s: float = 30.0


class MissingExtra(GnnFaasError):
    """An optional dependency (pip extra) is not installed."""

    def __init__(self, feature: str, extra: str, module: str):
        super().__init__(f"{feature} needs the '{module}' package: pip install 'gnn-faas[{extra}]'")


class Unavailable(GnnFaasError):
    """No instance could serve the request right now (503, with ``Retry-After``
    seconds as a client should wait before trying again)."""

    http_status = 503
    retry_after_s: float = 1.0


class ForwardFailed(GnnFaasError):
    """A function could not reach the function it forwards its result to (a
    memory function sending its aggregate to a compute function): the next
    stage is at fault, not this one (502, named in ``X-Gnn-Faas-Failed``)."""

    http_status = 502


FAILED_HEADER = "X-Gnn-Faas-Failed"


def http_status(exc: BaseException) -> int:
    """The HTTP status an exception maps to: its ``http_status`` for a
    :class:`GnnFaasError`, else 500 (an unexpected fault of ours)."""
    if isinstance(exc, GnnFaasError):
        return int(exc.http_status)
    return 500


def failure_kind(exc: BaseException) -> str | None:
    """What a function names in ``X-Gnn-Faas-Failed`` so the gateway knows whose
    fault an error is: ``forward`` (the next function), ``store`` (the graph
    store did not answer), ``corrupt`` (the store's data is corrupt); ``None``
    for the rest."""
    if isinstance(exc, ForwardFailed):
        return "forward"
    if isinstance(exc, StoreUnavailable):
        return "store"
    if isinstance(exc, (CorruptBlob, BlobNotFound)):
        return "corrupt"
    return None


def http_headers(exc: BaseException) -> dict[str, str]:
    """Extra response headers for an error: ``Retry-After`` (whole seconds, at
    least 1) on every 503; ``X-Gnn-Faas-Failed`` naming whose fault it is
    (:func:`failure_kind`)."""
    out: dict[str, str] = {}
    kind = failure_kind(exc)
    if kind is not None:
        out[FAILED_HEADER] = kind
    if isinstance(exc, Unauthorized):
        out["WWW-Authenticate"] = 'Bearer realm="gnn-faas"'
    if http_status(exc) == 503:
        seconds = getattr(exc, "retry_after_s", 1.0)
        out["Retry-After"] = str(max(1, int(-(-float(seconds) // 1))))
    return out

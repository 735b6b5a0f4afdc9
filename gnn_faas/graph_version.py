"""The graph version the request a thread serves runs on.

A versioned graph (storage/versions.py) changes while it is served; every
execution reads one version from start to end. The gateway picks the version
when a request arrives and runs its execution under :func:`scope`; every
function call then carries it in :data:`HEADER` (functions/client.py), and a
function answers that call on that version (a memory function's rows:
functions/row_versions.py). No broadcast is needed: a function that sees a
newer version than it knows reads only the new segments.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

HEADER = "X-Gnn-Faas-Graph-Version"

_version: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "gnn_faas_graph_version", default=None
)


def get() -> int | None:
    """The version of the request this thread serves (``None``: unversioned)."""
    return _version.get()


@contextmanager
def scope(version: int | None) -> Iterator[None]:
    token = _version.set(version)
    try:
        yield
    finally:
        _version.reset(token)


def header_value() -> str | None:
    v = _version.get()
    return None if v is None else str(int(v))


def from_header(value: str | None) -> int | None:
    """A caller's :data:`HEADER` (``None``: absent or not a non-negative integer)."""
    if not value or not value.isdigit() or len(value) > 18:
        return None
    return int(value)

"""The graph version the request a thread serves runs on.

A versioned graph (storage/versions.py) changes while it is served; every
execution reads one version from start to end. The gateway picks the version
when a request arrives and runs its execution under :func:`scope`; every
function call then carries it in :data:`HEADER` (functions/client.py), and a
function answers that call on that version (a memory function's rows:
functions/row_versions.py). No broadcast is needed: a function that sees a
newer version than it knows reads only the new segments, and only those up to
the request's *rows version* (:func:`rows`): versions that changed nothing but
edges are the gateway's business (it sends each call its structure).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

HEADER = "X-Gnn-Faas-Graph-Version"

# (version, rows version): see :func:`scope`
_version: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "gnn_faas_graph_version", default=None
)


def get() -> int | None:
    """The version of the request this thread serves (``None``: unversioned)."""
    v = _version.get()
    return None if v is None else v[0]


def rows() -> int | None:
    """The newest version at or before :func:`get` that added vertices, set feature
    rows or moved the base (``None``: unversioned). Between it and :func:`get` only
    edges changed: a memory function that knows it needs nothing newer to answer
    (the edges come with the call)."""
    v = _version.get()
    return None if v is None else v[1]


@contextmanager
def scope(version: int | None, rows_version: int | None = None) -> Iterator[None]:
    """Run on ``version`` (``rows_version``: see :func:`rows`; default ``version``)."""
    if version is None:
        value = None
    else:
        r = version if rows_version is None else min(int(rows_version), int(version))
        value = (int(version), r)
    token = _version.set(value)
    try:
        yield
    finally:
        _version.reset(token)


def header_value() -> str | None:
    """``V`` or ``V/R`` (``R`` the rows version, sent when older than ``V``)."""
    v = _version.get()
    if v is None:
        return None
    return str(v[0]) if v[1] == v[0] else f"{v[0]}/{v[1]}"


def from_header(value: str | None) -> tuple[int | None, int | None]:
    """``(version, rows version)`` of a caller's :data:`HEADER` (``(None, None)``:
    absent or not ``V`` or ``V/R`` of non-negative integers with ``R <= V``)."""
    if not value or len(value) > 40:
        return None, None
    v, sep, r = value.partition("/")
    if not v.isdigit() or len(v) > 18 or (sep and (not r.isdigit() or len(r) > 18)):
        return None, None
    version = int(v)
    rows_version = int(r) if r else version
    if rows_version > version:
        return None, None
    return version, rows_version

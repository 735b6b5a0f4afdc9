"""The deadline of the request a thread serves: when its answer is due.

One context variable (``time.monotonic()`` seconds, or ``None``) that every
blocking step of a request consults: function calls cut their timeout to it
(:mod:`gnn_faas.functions.client`), store calls stop retrying at it
(:meth:`gnn_faas.storage.backends.StorageBackend.guarded`) and a wait on a store read
another request started gives up at it (:mod:`gnn_faas.storage.chunked`).
The gateway opens a scope per request (accept time + ``request_timeout_s``);
function calls carry what is left in the :data:`HEADER` header, and the
function opens the same scope for its own store reads, so no stage of a
request outlives the time the gateway promised the client
(docs/architecture.md, section 6).

Scopes nest and only ever shorten: an inner scope longer than the outer one
keeps the outer deadline. Work handed to another thread keeps the deadline only
where its context is copied (``contextvars.copy_context``), as the function
pools do.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

HEADER = "X-Gnn-Faas-Deadline-Ms"
# a deadline sent by a caller is trusted up to this long (a bad header cannot
# make a function wait for hours)
MAX_HEADER_S = 3600.0

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "gnn_faas_deadline", default=None
)


def get() -> float | None:
    """The current deadline (monotonic seconds), or ``None``."""
    return _deadline.get()


def remaining() -> float | None:
    """Seconds left before the current deadline (negative once past), or ``None``."""
    d = _deadline.get()
    return None if d is None else d - time.monotonic()


def bounded(timeout: float | None) -> float | None:
    """``timeout`` cut to what is left of the deadline (never below 0)."""
    left = remaining()
    if left is None:
        return timeout
    left = max(0.0, left)
    return left if timeout is None else min(float(timeout), left)


@contextmanager
def scope(seconds: float | None) -> Iterator[None]:
    """Within the block the deadline is at most ``seconds`` from now (``None``:
    unchanged)."""
    if seconds is None:
        yield
        return
    at = time.monotonic() + float(seconds)
    outer = _deadline.get()
    token = _deadline.set(at if outer is None else min(outer, at))
    try:
        yield
    finally:
        _deadline.reset(token)


def header_value() -> str | None:
    """What a call sends in :data:`HEADER`: the milliseconds left (at least 0),
    or ``None`` without a deadline."""
    left = remaining()
    return None if left is None else str(max(0, int(left * 1e3)))


def from_header(value: str | None) -> float | None:
    """Seconds a caller's :data:`HEADER` grants (``None``: absent or not a
    finite non-negative number, which leaves the callee without a deadline)."""
    if not value:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    if not math.isfinite(ms) or ms < 0:
        return None
    return min(ms / 1e3, MAX_HEADER_S)

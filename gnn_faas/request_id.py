"""Request ids across processes: W3C Trace Context (``traceparent``).

A request's id is the 32-hex *trace id* of its ``traceparent`` header
(``00-<trace id>-<parent span id>-<flags>``, https://www.w3.org/TR/trace-context/).
Every gnn-faas HTTP app (gateway, memory and compute functions) runs
:func:`install`'s hooks: a valid incoming ``traceparent`` is continued (its
trace id kept, ``flags`` and ``tracestate`` carried), an absent or malformed one
starts a new trace; the answer carries ``traceparent`` with this process's span
id. While a request is served the context is in a :class:`~contextvars.ContextVar`:
log records carry it as ``request_id`` (:mod:`gnn_faas.logs`), and the
function clients send :func:`outgoing_headers` (a child span of it) on every
call, so one id ties the gateway's, the memory function's and the compute
function's log lines together.

Graph sharing runs one execution for several requests: :func:`for_execution`
keeps the request's trace when all of them share one, else it starts a trace
of its own and logs its link to every request's id (OpenTelemetry's span
links for batches), so the functions' lines of a shared execution are found
from any of its requests in two steps.
"""

from __future__ import annotations

import contextvars
import logging
import random
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

HEADER = "traceparent"
STATE_HEADER = "tracestate"
MAX_STATE_CHARS = 512  # W3C: vendors must propagate at least 512 characters

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
T = TypeVar("T")
log = logging.getLogger("gnn_faas.request_id")


@dataclass(frozen=True)
class TraceContext:
    """One process's span of a trace: ``trace_id`` (the request id, 32 hex),
    ``span_id`` (16 hex), ``flags`` (2 hex, ``01`` = sampled) and the vendor
    ``state`` (``tracestate``, passed through unchanged)."""

    trace_id: str
    span_id: str
    flags: str = "00"
    state: str = ""

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def child(self) -> TraceContext:
        """A new span of the same trace (what a call to another process carries)."""
        return TraceContext(self.trace_id, _span_id(), self.flags, self.state)

    def headers(self) -> dict[str, str]:
        out = {HEADER: self.traceparent}
        if self.state:
            out[STATE_HEADER] = self.state
        return out


# Ids need to be unique, not secret: the random module (reseeded in every forked
# worker) is several times cheaper per call than the secrets module.
def _span_id() -> str:
    return f"{random.getrandbits(64) or 1:016x}"


def new_trace() -> TraceContext:
    """A trace of its own (flags ``00``: nothing recorded it upstream)."""
    return TraceContext(f"{random.getrandbits(128) or 1:032x}", _span_id())


def parse_traceparent(value: str | None, state: str | None = None) -> TraceContext | None:
    """The context a ``traceparent`` header names, or ``None`` when it is absent
    or invalid by the W3C rules: lowercase hex fields, version ``ff`` refused,
    version ``00`` exactly 55 characters (a later version may append fields
    after a ``-``), trace id and parent id not all zeros."""
    if not value:
        return None
    value = value.strip()
    m = _TRACEPARENT.match(value)
    if m is None:
        return None
    version, trace_id, span_id, flags = m.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    if len(value) != 55 and (version == "00" or value[55] != "-"):
        return None
    state = (state or "").strip()
    return TraceContext(trace_id, span_id, flags, state if len(state) <= MAX_STATE_CHARS else "")


_current: contextvars.ContextVar[TraceContext | None] = contextvars.ContextVar(
    "gnn_faas_trace", default=None
)


def current() -> TraceContext | None:
    """The trace context of the request being served here (``None``: none)."""
    return _current.get()


def current_request_id() -> str | None:
    ctx = _current.get()
    return None if ctx is None else ctx.trace_id


def outgoing_headers() -> dict[str, str]:
    """Headers for a call made on behalf of the current request: a child span
    of its trace (``{}`` outside any request)."""
    ctx = _current.get()
    return {} if ctx is None else ctx.child().headers()


@contextmanager
def bound(ctx: TraceContext | None) -> Iterator[TraceContext | None]:
    """Make ``ctx`` the current context within the block."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def traced(ctx: TraceContext | None, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` that runs under ``ctx`` wherever it is called (another thread)."""

    def run(*args: Any, **kwargs: Any) -> T:
        with bound(ctx):
            return fn(*args, **kwargs)

    return run


def for_execution(traces: Iterable[TraceContext | None]) -> TraceContext:
    """The context one execution serving several requests runs under: a child
    of their trace when they all share one (a lone request: its own), else a
    new trace whose links to the requests' ids are logged here."""
    given = [t for t in traces if t is not None]
    ids = list(dict.fromkeys(t.trace_id for t in given))
    if len(ids) == 1:
        return given[0].child()
    ctx = new_trace()
    if ids:
        with bound(ctx):
            log.info("one execution serves %d requests", len(ids), extra={"links": ids})
    return ctx


def unbind(var: contextvars.ContextVar, token: contextvars.Token | None) -> None:
    """Undo a request's ``var.set`` (its ``token``; ``None``: nothing was set).
    A token set in another context (cannot happen under WSGI) clears ``var``."""
    if token is None:
        return
    try:
        var.reset(token)
    except ValueError:
        var.set(None)


def install(app) -> None:
    """Continue or start a trace for every request of the Flask ``app``; answer
    with its ``traceparent`` (this process's span)."""
    from flask import g, request

    @app.before_request
    def _bind_trace() -> None:
        incoming = parse_traceparent(request.headers.get(HEADER), request.headers.get(STATE_HEADER))
        ctx = new_trace() if incoming is None else incoming.child()
        g.gnn_faas_trace = ctx
        g.gnn_faas_trace_token = _current.set(ctx)

    @app.after_request
    def _answer_trace(resp):
        ctx = getattr(g, "gnn_faas_trace", None)
        if ctx is not None:
            resp.headers[HEADER] = ctx.traceparent
        return resp

    @app.teardown_request
    def _unbind_trace(exc) -> None:
        unbind(_current, g.pop("gnn_faas_trace_token", None))

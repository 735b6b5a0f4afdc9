"""Flask glue shared by every gnn-faas HTTP app (functions and gateway).

:func:`install` gives an app the project's HTTP conventions:

- a :class:`~gnn_faas.errors.GnnFaasError` becomes ``{"error": message}`` with
  the exception's ``http_status``; 404/405/413 and every other HTTP error are
  JSON too, and an unexpected exception is a logged 500 ``{"error": ...}``
  (never an HTML page or a traceback on the wire), so one bad request never
  stops an instance from serving the next;
- every JSON answer is strict JSON (:class:`StrictJSONProvider`: no NaN or
  Infinity; such a value is a logged 500);
- ``MAX_CONTENT_LENGTH`` bounds request bodies (413 beyond it);
- a timing hook measures every request (``Server-Timing`` header and the
  :class:`RequestTimer` figures under ``app.extensions["gnn_faas_timer"]``);
- every request continues or starts a W3C trace, its request id
  (:func:`gnn_faas.request_id.install`: log lines carry it, calls to the
  functions send it on, the answer's ``traceparent`` names it).

Helpers read frames and JSON bodies and build frame responses.

Frame endpoints (:func:`frame_route`), the functions' hot calls, and body
endpoints (:func:`body_route`, the gateway's inference) are served twice over:
as Flask views, and by :class:`FrameDispatcher`, a WSGI app in front of Flask
that answers such a request itself with the same conventions (errors, limits,
``Server-Timing``, trace context, the timer). A function call on a small graph
is mostly fixed cost, and Flask's request machinery (request context, routing,
hooks, the response object) was about a third of it; every other path and
body still goes to Flask. A server that frames requests itself
(``functions/buffered_worker.py``) hands the dispatcher the bytes it read, so
such a request is not parsed twice either.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from flask import Flask, Response, g, jsonify, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.exceptions import NotFound as NoRoute

from gnn_faas import deadline, graph_version, request_id
from gnn_faas.errors import GnnFaasError, http_headers, http_status
from gnn_faas.wire import (
    DEFAULT_MAX_BYTES,
    FRAME_MIME,
    decode_frame,
    decode_json,
    encode_frame,
)

log = logging.getLogger("gnn_faas.http")


class RequestTimer:
    """Counts requests and the seconds spent serving them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.seconds = 0.0

    def record(self, seconds: float, status: int) -> None:
        with self._lock:
            self.requests += 1
            self.seconds += seconds
            if status >= 400:
                self.errors += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "errors": self.errors, "seconds": self.seconds}


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON with ``allow_nan=False``: NaN or Infinity in an answer raises
    (a logged 500) instead of producing a body that is not JSON."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("allow_nan", False)
        return super().dumps(obj, **kwargs)


@dataclass
class CallTimes:
    """What one request's answer reports in ``Server-Timing`` beside ``app``:
    seconds of frame (de)serialisation, and a handler's own entries (ms)."""

    serde: float = 0.0
    entries: dict[str, float] = field(default_factory=dict)

    def header(self, app_seconds: float) -> str:
        timing = f"app;dur={app_seconds * 1e3:.3f}, serde;dur={self.serde * 1e3:.3f}"
        for name, ms in self.entries.items():  # e.g. a memory function's forwarded call
            timing += f", {name};dur={ms:.3f}"
        return timing


_times: contextvars.ContextVar[CallTimes | None] = contextvars.ContextVar(
    "gnn_faas_call_times", default=None
)


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = status
    resp.headers.update(headers or {})
    return resp


def install(app: Flask, max_content_length: int = DEFAULT_MAX_BYTES) -> Flask:
    """Add JSON error handlers, the body size limit and the request timer to ``app``."""
    app.config["MAX_CONTENT_LENGTH"] = int(max_content_length)
    app.json = StrictJSONProvider(app)
    app.json.sort_keys = False
    timer = RequestTimer()
    app.extensions["gnn_faas_timer"] = timer
    request_id.install(app)

    @app.errorhandler(GnnFaasError)
    def _gnn_faas_error(exc: GnnFaasError):
        if http_status(exc) == 500:  # ours, not the client's: the log says why
            log.error("error serving %s %s: %s", request.method, request.path, exc)
        return error_response(str(exc) or type(exc).__name__, http_status(exc), http_headers(exc))

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if exc.code == 413:
            msg = f"request body exceeds the limit of {app.config['MAX_CONTENT_LENGTH']} bytes"
        else:
            msg = exc.description or exc.name
        headers = {}
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return error_response(msg, exc.code or 500, headers)

    @app.before_request
    def _options():
        """``OPTIONS``: 204 with the ``Allow`` of the path's routes (404 for none)."""
        if request.method != "OPTIONS":
            return None
        adapter = app.url_map.bind_to_environ(request.environ)
        try:
            adapter.match(method="\x00")  # no route takes this method: MethodNotAllowed
        except MethodNotAllowed as exc:
            allowed = sorted({*(exc.valid_methods or ()), "OPTIONS"})
            return Response(status=204, headers={"Allow": ", ".join(allowed)})
        except NoRoute:
            return error_response(f"no such path {request.path!r}", 404)
        return None

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        if isinstance(exc, HTTPException):  # pragma: no cover - handled above
            return _http_error(exc)
        # a bug of ours: the traceback goes to the log, a short JSON to the client
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return error_response(f"internal error ({type(exc).__name__})", http_status(exc))

    @app.before_request
    def _start_timer():
        g.gnn_faas_t0 = time.perf_counter()
        g.gnn_faas_times = CallTimes()
        g.gnn_faas_times_token = _times.set(g.gnn_faas_times)
        granted = deadline.from_header(request.headers.get(deadline.HEADER))
        if granted is not None:  # the caller's deadline bounds this call's store reads
            g.gnn_faas_deadline = deadline.scope(granted)
            g.gnn_faas_deadline.__enter__()
        version = graph_version.from_header(request.headers.get(graph_version.HEADER))
        if version[0] is not None:  # the caller's graph version: this call answers on it
            g.gnn_faas_version = graph_version.scope(*version)
            g.gnn_faas_version.__enter__()

    @app.after_request
    def _stop_timer(resp: Response):
        t0 = getattr(g, "gnn_faas_t0", None)
        if t0 is not None:
            dt = time.perf_counter() - t0
            timer.record(dt, resp.status_code)
            # the handler's time, and of it the frames' (de)serialisation
            resp.headers["Server-Timing"] = g.gnn_faas_times.header(dt)
        return resp

    @app.teardown_request
    def _unbind_times(exc) -> None:
        request_id.unbind(_times, g.pop("gnn_faas_times_token", None))
        for key in ("gnn_faas_version", "gnn_faas_deadline"):
            scope = g.pop(key, None)
            if scope is not None:
                scope.__exit__(None, None, None)

    return app


def request_body() -> bytes:
    """The raw request body (413 beyond ``MAX_CONTENT_LENGTH``, via werkzeug)."""
    return request.get_data(cache=False)


def read_frame() -> tuple[dict, dict]:
    """The request's frame as ``(tensors, params)``; a JSON object body is taken as
    params only (``{}`` tensors) so small calls can skip the binary format."""
    body = request_body()
    limit = _limit()
    if _is_json():
        return {}, decode_json(body, limit)
    t0 = time.perf_counter()
    try:
        return decode_frame(body, max_bytes=limit)
    finally:
        _count_serde(time.perf_counter() - t0)


def add_server_timing(name: str, ms: float) -> None:
    """One more ``Server-Timing`` entry on this request's answer (milliseconds;
    added to an entry of the same name, e.g. one per forwarded call)."""
    times = _times.get()
    if times is not None:
        times.entries[name] = times.entries.get(name, 0.0) + float(ms)


def _count_serde(seconds: float) -> None:
    times = _times.get()
    if times is not None:
        times.serde += seconds


def frame_response(tensors: dict, params: dict | None = None, status: int = 200) -> Response:
    t0 = time.perf_counter()
    body = encode_frame(tensors, params)
    _count_serde(time.perf_counter() - t0)
    return Response(body, status=status, mimetype=FRAME_MIME)


def encoded_frame_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status=status, mimetype=FRAME_MIME)


def _is_json() -> bool:
    return request.mimetype == "application/json" or request.mimetype.endswith("+json")


def _limit() -> int:
    from flask import current_app

    return int(current_app.config.get("MAX_CONTENT_LENGTH") or DEFAULT_MAX_BYTES)


# -- frame and body endpoints --------------------------------------------------------
FRAME_ROUTES = "gnn_faas_frame_routes"
BODY_ROUTES = "gnn_faas_body_routes"
FrameHandler = Callable[[dict, dict], "bytes | dict[str, Any]"]
# (path parameters, body, request headers with lower-case names) -> (answer, its headers)
BodyHandler = Callable[[dict, bytes, Mapping[str, str]], "tuple[bytes, dict[str, str]]"]


def frame_route(app: Flask, path: str, handler: FrameHandler, bounded: bool = True) -> None:
    """Serve ``POST path`` with ``handler(tensors, params)``, whose answer is an
    encoded frame (bytes) or the answer's tensors: as a Flask view (any body
    :func:`read_frame` takes), and by :class:`FrameDispatcher` for frame bodies.
    ``bounded``: the handler's work grows with its body (a small body is a
    short call), so the server may run a small one on its event loop
    (``functions/buffered_worker.py``)."""

    def view() -> Response:
        out = handler(*read_frame())
        return encoded_frame_response(out) if isinstance(out, bytes) else frame_response(out)

    app.add_url_rule(path, endpoint=f"frame:{path}", view_func=view, methods=["POST"])
    app.extensions.setdefault(FRAME_ROUTES, {})[path] = (handler, bounded)


def body_route(app: Flask, pattern: str, handler: BodyHandler) -> None:
    """Let :class:`FrameDispatcher` answer ``POST`` requests whose path matches
    ``pattern`` (a regular expression, matched whole; its named groups are the
    handler's path parameters) with ``handler(params, body, headers)``, whose
    answer is a 200's body and headers; any body with a declared length. The
    app keeps its own Flask view of the same paths, which answers the rest
    (chunked bodies, paths with percent-escapes) and serves the app without
    the dispatcher; both should call the same code."""
    app.extensions.setdefault(BODY_ROUTES, []).append((re.compile(pattern), handler))


LOOP_ROUTES = "gnn_faas_loop_routes"


def loop_route(app: Flask, path: str, handler: Callable[[], tuple[int, dict]]) -> None:
    """Serve ``GET path`` with ``handler()``, whose answer is ``(status, JSON
    object)``: as a Flask view, and by the server's event loop itself
    (``functions/buffered_worker.py``), which answers it without a thread.
    The handler must never block: liveness is answered this way, so a server
    whose every thread waits (on a hung store, say) still says it is alive."""

    def view() -> Response:
        status, doc = handler()
        return jsonify(doc), status

    app.add_url_rule(path, endpoint=f"loop:{path}", view_func=view, methods=["GET"])
    app.extensions.setdefault(LOOP_ROUTES, {})[path] = handler


def _json_error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def environ_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """A WSGI request's headers by lower-case name (``Content-Type`` and
    ``Content-Length`` included)."""
    out = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            out[key.replace("_", "-").lower()] = environ[key]
    return out


class FrameDispatcher:
    """WSGI app in front of a Flask ``app``: a ``POST`` with a declared length
    of a frame body to a :func:`frame_route` path, or of any body to a
    :func:`body_route` path, is answered here, everything else by Flask. Same
    answers as Flask's views and :func:`install`'s hooks: the handler's answer
    or a JSON error with the exception's status and headers (413 beyond
    ``MAX_CONTENT_LENGTH``, a logged 500 for a fault of ours),
    ``Server-Timing`` (app, serde and the handler's entries), the answer's
    ``traceparent`` (the request's trace continued or started) and the timer."""

    def __init__(self, app: Flask):
        self.app = app
        routes = app.extensions.get(FRAME_ROUTES, {})
        self.routes: dict[str, FrameHandler] = {p: h for p, (h, _) in routes.items()}
        self.body_routes: list[tuple[re.Pattern, BodyHandler]] = list(
            app.extensions.get(BODY_ROUTES, [])
        )
        # what a server may run on its event loop when small (frame_route's ``bounded``)
        self.inline_paths = frozenset(p for p, (_, bounded) in routes.items() if bounded)
        self.timer: RequestTimer = app.extensions["gnn_faas_timer"]
        self.loop_routes: dict[str, Callable[[], tuple[int, dict]]] = dict(
            app.extensions.get(LOOP_ROUTES, {})
        )
        self.limit = int(app.config.get("MAX_CONTENT_LENGTH") or DEFAULT_MAX_BYTES)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        length = environ.get("CONTENT_LENGTH")
        if (
            not self.takes(
                environ.get("REQUEST_METHOD", ""),
                environ.get("PATH_INFO", ""),
                environ.get("CONTENT_TYPE"),
            )  # fmt: skip
            or not (length or "").isdigit()
            or "HTTP_TRANSFER_ENCODING" in environ
        ):
            return self.app(environ, start_response)
        n = int(length)
        body = b"" if n > self.limit else environ["wsgi.input"].read(n)
        status, headers, out = self.answer(environ["PATH_INFO"], body, n, environ_headers(environ))
        start_response(f"{status} {reason(status)}", headers)
        return [out]

    def answer_loop(self, path: str) -> tuple[int, list[tuple[str, str]], bytes]:
        """``(status, headers, body)`` of ``GET path`` for a :func:`loop_route`."""
        status, doc = self.loop_routes[path]()
        body = json.dumps(doc).encode()
        self.timer.record(0.0, status)
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        return status, headers, body

    def takes(self, method: str, path: str, content_type: str | None) -> bool:
        """Whether a request with these is answered here (the rest goes to Flask)."""
        if method != "POST":
            return False
        if path in self.routes:
            return (content_type or "").split(";")[0].strip().lower() == FRAME_MIME
        return self._body_route(path) is not None

    def serves(self, path: str) -> bool:
        """Whether ``path`` is a frame or body route (a ``POST`` there with the
        right body is answered here; :meth:`takes` checks the body's type)."""
        return path in self.routes or self._body_route(path) is not None

    def _body_route(self, path: str) -> tuple[BodyHandler, dict] | None:
        if "%" in path:  # Flask unquotes escapes: such a path is its to route
            return None
        for pattern, handler in self.body_routes:
            m = pattern.fullmatch(path)
            if m is not None:
                return handler, m.groupdict()
        return None

    def answer(
        self,
        path: str,
        body: bytes,
        length: int,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """``(status, headers, body)`` of a request to ``path`` that :meth:`takes`
        (``length``: its declared body length; over the limit, ``body`` is not
        read; ``headers``: the request's, by lower-case name): what the WSGI
        call answers, and what a server that framed the request itself sends
        (``functions/buffered_worker.py``)."""
        t0 = time.perf_counter()
        headers = headers or {}
        incoming = request_id.parse_traceparent(
            headers.get("traceparent"), headers.get("tracestate")
        )
        ctx = request_id.new_trace() if incoming is None else incoming.child()
        times = CallTimes()
        token = _times.set(times)
        try:
            # the caller's deadline bounds this call's store reads (gnn_faas/deadline.py)
            granted = deadline.from_header(headers.get(deadline.HEADER.lower()))
            version = graph_version.from_header(headers.get(graph_version.HEADER.lower()))
            with request_id.bound(ctx), deadline.scope(granted), graph_version.scope(*version):
                status, out_headers, out = self._answer(path, body, length, headers)
        finally:
            _times.reset(token)
        dt = time.perf_counter() - t0
        self.timer.record(dt, status)
        out_headers += [
            ("Content-Length", str(len(out))),
            ("Server-Timing", times.header(dt)),
            (request_id.HEADER, ctx.traceparent),
        ]
        return status, out_headers, out

    def _answer(
        self, path: str, body: bytes, length: int, headers: Mapping[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            if length > self.limit:
                msg = f"request body exceeds the limit of {self.limit} bytes"
                return 413, [("Content-Type", "application/json")], _json_error(msg)
            handler = self.routes.get(path)
            if handler is None:
                route = self._body_route(path)
                if route is None:  # pragma: no cover - callers ask takes() first
                    raise KeyError(path)
                out, out_headers = route[0](route[1], body, headers)
                return 200, list(out_headers.items()), out
            t0 = time.perf_counter()
            try:
                tensors, params = decode_frame(body, max_bytes=self.limit)
            finally:
                _count_serde(time.perf_counter() - t0)
            del body
            out = handler(tensors, params)
            if not isinstance(out, bytes):
                t0 = time.perf_counter()
                out = encode_frame(out)
                _count_serde(time.perf_counter() - t0)
            return 200, [("Content-Type", FRAME_MIME)], out
        except GnnFaasError as exc:
            status = http_status(exc)
            if status == 500:  # ours, not the client's: the log says why
                log.error("error serving POST %s: %s", path, exc)
            out_headers = [("Content-Type", "application/json"), *http_headers(exc).items()]
            return status, out_headers, _json_error(str(exc) or type(exc).__name__)
        except Exception as exc:
            log.exception("unhandled error serving POST %s", path)
            out = _json_error(f"internal error ({type(exc).__name__})")
            return http_status(exc), [("Content-Type", "application/json")], out


def reason(status: int) -> str:
    """The reason phrase of an HTTP status (``Unknown`` for a code without one)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def wsgi_app(app: Any) -> Any:
    """The WSGI app to serve: a Flask app with frame or body routes behind a
    :class:`FrameDispatcher`, anything else as it is."""
    if isinstance(app, Flask) and (
        app.extensions.get(FRAME_ROUTES)
        or app.extensions.get(BODY_ROUTES)
        or app.extensions.get(LOOP_ROUTES)
    ):
        return FrameDispatcher(app)
    return app

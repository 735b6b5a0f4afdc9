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
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from flask import Flask, Response, g, jsonify, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.exceptions import HTTPException

from gnn_faas import request_id
from gnn_faas.errors import GnnFaasError, InvalidRequest, http_headers, http_status
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
        return error_response(msg, exc.code or 500)

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

    @app.after_request
    def _stop_timer(resp: Response):
        t0 = getattr(g, "gnn_faas_t0", None)
        if t0 is not None:
            dt = time.perf_counter() - t0
            timer.record(dt, resp.status_code)
            # the handler's time, and of it the frames' (de)serialisation
            serde = getattr(g, "gnn_faas_serde", 0.0)
            timing = f"app;dur={dt * 1e3:.3f}, serde;dur={serde * 1e3:.3f}"
            # a handler's own entries (a memory function's forwarded call)
            for name, ms in getattr(g, "gnn_faas_timing", {}).items():
                timing += f", {name};dur={ms:.3f}"
            resp.headers["Server-Timing"] = timing
        return resp

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
    """One more ``Server-Timing`` entry on this request's answer (milliseconds)."""
    if not hasattr(g, "gnn_faas_timing"):
        g.gnn_faas_timing = {}
    g.gnn_faas_timing[name] = float(ms)


def _count_serde(seconds: float) -> None:
    g.gnn_faas_serde = getattr(g, "gnn_faas_serde", 0.0) + seconds


def read_json() -> dict[str, Any]:
    """The request's JSON object body."""
    body = request_body()
    if request.mimetype == FRAME_MIME:
        raise InvalidRequest(f"this endpoint takes a JSON body, not {FRAME_MIME}")
    return decode_json(body, _limit())


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

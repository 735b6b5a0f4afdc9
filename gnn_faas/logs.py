"""Structured logs: one JSON object per line, in every gnn-faas process.

Every line is ``{"ts", "level", "logger", "msg", ...}`` plus the record's
``extra={...}`` fields and, while a request is served, its ``request_id`` (the
W3C trace id, :mod:`gnn_faas.request_id`). Three sources share the format:

- the ``gnn_faas`` loggers (:func:`configure_logging`, on stderr; level from
  the argument, else ``$GNN_FAAS_LOG_LEVEL``, else ``info``), with Python's
  warnings routed through logging (``py.warnings``) instead of raw stderr;
- gunicorn's error log and access log (:class:`GunicornJsonLogger`, the
  ``logger_class`` of every server this project runs): an access line has
  ``method``, ``path``, ``query``, ``status``, ``bytes``, ``duration_s``,
  ``remote`` and the ``request_id`` of the answer's ``traceparent`` (probes and
  scrapes, :data:`QUIET_PATHS`, only when they fail);
- one-off lines printed before logging is set up (:func:`json_line`, e.g. a
  server's ``listening on URL`` line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from gunicorn import glogging

from gnn_faas import request_id

LEVEL_ENV = "GNN_FAAS_LOG_LEVEL"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_SCALARS = (int, float, str, bool, type(None))
# probes and scrapes: an access line only when they fail
QUIET_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", "/_/health", "/metrics"})


def _jsonable(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS) for v in value):
        return list(value)
    return str(value)


def json_line(logger: str, msg: str, level: str = "info", **fields: Any) -> str:
    """One log line in the project's format (for lines printed, not logged)."""
    out = {"ts": round(time.time(), 3), "level": level, "logger": logger, "msg": msg}
    out.update({k: _jsonable(v) for k, v in fields.items()})
    return json.dumps(out)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = _jsonable(value)
        if "request_id" not in out:
            rid = request_id.current_request_id()
            if rid is not None:
                out["request_id"] = rid
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


LEVELS = ("debug", "info", "warning", "error", "critical")


def _level(level: str | None) -> str:
    name = (level or os.environ.get(LEVEL_ENV) or "info").lower()
    if name not in LEVELS:
        from gnn_faas.errors import InvalidRequest

        source = "the log level" if level else f"${LEVEL_ENV}"
        raise InvalidRequest(f"{source} must be one of {', '.join(LEVELS)}, got {name!r}")
    return name.upper()


def configure_logging(level: str | None = None) -> None:
    """JSON lines on stderr for the ``gnn_faas`` loggers and Python's warnings
    (call once per process; again after a fork is harmless)."""
    level = _level(level)  # a bad level is refused before anything changes
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("gnn_faas", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
    logging.getLogger("gnn_faas").setLevel(level)
    logging.captureWarnings(True)


def ensure_logging() -> None:
    """:func:`configure_logging` at the default level, unless this process did already."""
    if not any(
        isinstance(h.formatter, JsonFormatter) for h in logging.getLogger("gnn_faas").handlers
    ):
        configure_logging()


class GunicornJsonLogger(glogging.Logger):
    """gunicorn's logger with every handler writing :class:`JsonFormatter`
    lines, and access lines as fields rather than an Apache format string."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in logger.handlers:
                handler.setFormatter(JsonFormatter())

    def access(self, resp, req, environ, request_time) -> None:
        if not self.access_log.handlers:  # no access log configured
            return
        try:
            status = int(str(resp.status).split(None, 1)[0])
            if status < 400 and environ.get("PATH_INFO") in QUIET_PATHS:
                return
            headers = {k.lower(): v for k, v in (resp.headers or [])}
            ctx = request_id.parse_traceparent(headers.get(request_id.HEADER))
            self.access_line(
                environ.get("REQUEST_METHOD", ""),
                environ.get("PATH_INFO", ""),
                environ.get("QUERY_STRING", ""),
                status,
                getattr(resp, "sent", None),
                request_time.total_seconds(),
                environ.get("REMOTE_ADDR", ""),
                None if ctx is None else ctx.trace_id,
            )
        except Exception:  # an access line must never break serving
            self.error_log.exception("access log line failed")

    def access_line(
        self,
        method: str,
        path: str,
        query: str,
        status: int,
        sent: int | None,
        seconds: float,
        remote: str,
        trace_id: str | None,
    ) -> None:
        """One access line with these fields (also for requests a worker answers
        without gunicorn's request objects, ``functions/buffered_worker.py``)."""
        if not self.access_log.handlers:  # no access log configured
            return
        try:
            self.access_log.info(
                "%s %s %d",
                method,
                path,
                status,
                extra={
                    "method": method,
                    "path": path,
                    "query": query,
                    "status": status,
                    "bytes": sent,
                    "duration_s": round(seconds, 6),
                    "remote": remote,
                    "request_id": trace_id,
                },
            )
        except Exception:  # an access line must never break serving
            self.error_log.exception("access log line failed")

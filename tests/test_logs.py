"""JSON log lines: the gnn_faas loggers (with the request id), gunicorn's error
and access logs, and lines printed before logging is set up."""

from __future__ import annotations

import datetime
import io
import json
import logging

from gunicorn.config import Config

from gnn_faas import request_id
from gnn_faas.logs import GunicornJsonLogger, JsonFormatter, configure_logging, json_line


def test_records_are_json_with_extras_and_the_current_request_id():
    stream = io.StringIO()
    logger = logging.getLogger("gnn_faas.test_logs")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    try:
        logger.warning("plain %d", 1, extra={"links": ["a", "b"], "n": 3, "obj": object})
        ctx = request_id.new_trace()
        with request_id.bound(ctx):
            logger.warning("inside")
            try:
                raise ValueError("boom")
            except ValueError:
                logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    plain, inside, failed = (json.loads(line) for line in stream.getvalue().splitlines())
    assert plain["msg"] == "plain 1" and plain["level"] == "warning"
    assert plain["logger"] == "gnn_faas.test_logs" and "request_id" not in plain
    assert plain["links"] == ["a", "b"] and plain["n"] == 3 and plain["obj"].startswith("<class")
    assert inside["request_id"] == failed["request_id"] == ctx.trace_id
    assert "ValueError: boom" in failed["exc"]


def test_configure_logging_routes_warnings_and_honours_the_env_level(monkeypatch, capsys):
    import warnings

    monkeypatch.setenv("GNN_FAAS_LOG_LEVEL", "warning")
    gnn = logging.getLogger("gnn_faas")
    saved = (gnn.handlers[:], gnn.level, gnn.propagate)
    # an earlier in-process CLI run may have left logging's capture on, which
    # captureWarnings(True) then skips while pytest has replaced showwarning
    logging.captureWarnings(False)
    try:
        configure_logging()
        logging.getLogger("gnn_faas.x").info("hidden at warning")
        logging.getLogger("gnn_faas.x").warning("shown")
        warnings.warn("a python warning", UserWarning, stacklevel=1)
        err = capsys.readouterr().err.splitlines()
        lines = [json.loads(line) for line in err]
        assert [line["msg"] for line in lines][0] == "shown"
        assert any("a python warning" in line["msg"] for line in lines[1:])
        assert lines[-1]["logger"] == "py.warnings"
    finally:
        logging.captureWarnings(False)
        gnn.handlers[:], gnn.level, gnn.propagate = saved
        logging.getLogger("py.warnings").handlers[:] = []


def test_an_unknown_level_is_a_clear_error(monkeypatch):
    import pytest

    from gnn_faas.errors import InvalidRequest

    monkeypatch.setenv("GNN_FAAS_LOG_LEVEL", "loud")
    with pytest.raises(InvalidRequest, match=r"\$GNN_FAAS_LOG_LEVEL must be one of .*'loud'"):
        configure_logging()
    with pytest.raises(InvalidRequest, match="the log level must be one of"):
        configure_logging("verbose")


class _Resp:
    status = "404 NOT FOUND"
    sent = 57

    def __init__(self, traceparent: str | None):
        self.headers = [("Content-Type", "application/json")]
        if traceparent:
            self.headers.append(("traceparent", traceparent))


def _gunicorn_logger(accesslog):
    cfg = Config()
    cfg.set("accesslog", accesslog)
    cfg.set("errorlog", "-")
    return GunicornJsonLogger(cfg)


def test_gunicorn_access_and_error_lines_are_json(capsys):
    glog = _gunicorn_logger("-")
    ctx = request_id.new_trace()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v2/models/m/infer",
        "QUERY_STRING": "a=1",
        "REMOTE_ADDR": "10.0.0.7",
    }
    glog.access(_Resp(ctx.traceparent), None, environ, datetime.timedelta(milliseconds=12.5))
    glog.access(_Resp(None), None, environ, datetime.timedelta(0))
    glog.error("worker %s exploded", "w1")
    out, err = capsys.readouterr()
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["logger"] == "gunicorn.access" and first["msg"] == "POST /v2/models/m/infer 404"
    assert first["status"] == 404 and first["method"] == "POST" and first["query"] == "a=1"
    assert first["duration_s"] == 0.0125 and first["bytes"] == 57 and first["remote"] == "10.0.0.7"
    assert first["request_id"] == ctx.trace_id and second["request_id"] is None
    (error,) = (json.loads(line) for line in err.splitlines())
    assert error["logger"] == "gunicorn.error" and error["msg"] == "worker w1 exploded"
    assert error["level"] == "error"


def test_probes_and_scrapes_are_logged_only_when_they_fail(capsys):
    glog = _gunicorn_logger("-")
    ok, failed = _Resp(None), _Resp(None)
    ok.status = "200 OK"
    for resp in (ok, failed):
        glog.access(resp, None, {"PATH_INFO": "/v2/health/ready"}, datetime.timedelta(0))
    (line,) = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert line["status"] == 404 and line["path"] == "/v2/health/ready"


def test_no_access_lines_without_an_access_log(capsys):
    glog = _gunicorn_logger(None)
    glog.access(_Resp(None), None, {}, datetime.timedelta(0))
    assert capsys.readouterr().out == ""


def test_printed_lines_share_the_format():
    line = json.loads(json_line("gnn_faas.server", "listening on http://h:1 (pid 2)", pid=2))
    assert line["level"] == "info" and line["pid"] == 2 and line["msg"].startswith("listening")

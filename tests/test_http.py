"""Frame endpoints answer the same through Flask and through FrameDispatcher."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flask import Flask
from werkzeug.test import Client

from gnn_faas import request_id
from gnn_faas.errors import InvalidRequest, Unavailable
from gnn_faas.functions.client import server_timing
from gnn_faas.http import FrameDispatcher, add_server_timing, frame_route, install, wsgi_app
from gnn_faas.wire import FRAME_MIME, decode_frame, encode_frame

LIMIT = 64 * 1024


def make_app() -> tuple[Flask, list]:
    """An app with one frame route (doubles ``x``; errors on request) and a
    record of the trace each call ran under."""
    app = install(Flask("t"), max_content_length=LIMIT)
    seen: list = []

    def double(tensors: dict, params: dict) -> dict:
        seen.append(request_id.current())
        fail = params.get("fail")
        if fail == "client":
            raise InvalidRequest("bad x")
        if fail == "busy":
            exc = Unavailable("not now")
            exc.retry_after_s = 2
            raise exc
        if fail == "bug":
            raise KeyError("oops")
        add_server_timing("inner", 1.5)
        return {"y": tensors["x"] * 2}

    frame_route(app, "/v1/double", double)

    @app.get("/v1/other")
    def other():
        return {"ok": True}

    return app, seen


@pytest.fixture(params=["flask", "dispatcher"])
def client(request) -> tuple[Client, list]:
    app, seen = make_app()
    served = app if request.param == "flask" else wsgi_app(app)
    assert isinstance(served, FrameDispatcher) == (request.param == "dispatcher")
    return Client(served), seen


def post(client: Client, tensors: dict, params: dict | None = None, headers=None):
    body = encode_frame(tensors, params)
    return client.post(
        "/v1/double", data=body, headers={"Content-Type": FRAME_MIME, **(headers or {})}
    )


def test_a_frame_is_answered_with_timing_and_trace(client):
    c, seen = client
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    r = post(c, {"x": x}, headers={"traceparent": parent})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith(FRAME_MIME)
    out, _ = decode_frame(r.data)
    np.testing.assert_array_equal(out["y"], 2 * x)
    timing = server_timing(r.headers["Server-Timing"])
    assert set(timing) == {"app", "serde", "inner"} and timing["inner"] == 1.5
    assert 0 <= timing["serde"] <= timing["app"]
    # the request's trace continued: same trace id, this process's own span
    ctx = request_id.parse_traceparent(r.headers["traceparent"])
    assert ctx.trace_id == "ab" * 16 and ctx.span_id != "cd" * 8
    assert seen[-1].trace_id == "ab" * 16
    assert request_id.current() is None  # nothing left bound after the request


@pytest.mark.parametrize(
    ("fail", "status", "message"),
    [("client", 400, "bad x"), ("busy", 503, "not now"), ("bug", 500, "internal error (KeyError)")],
)
def test_errors_are_json_with_their_status(client, fail, status, message):
    c, _ = client
    r = post(c, {"x": np.zeros(2, np.float32)}, {"fail": fail})
    assert r.status_code == status
    assert r.headers["Content-Type"].startswith("application/json")
    assert json.loads(r.data) == {"error": message}
    if fail == "busy":
        assert r.headers["Retry-After"] == "2"
    assert "Server-Timing" in r.headers


def test_a_body_over_the_limit_is_413(client):
    c, _ = client
    r = post(c, {"x": np.zeros(LIMIT // 4 + 10, np.float32)})
    assert r.status_code == 413
    assert "exceeds the limit" in json.loads(r.data)["error"]


def test_a_bad_frame_is_400_and_other_paths_go_to_flask(client):
    c, _ = client
    r = c.post("/v1/double", data=b"\x05not a frame", headers={"Content-Type": FRAME_MIME})
    assert r.status_code == 400 and "error" in json.loads(r.data)
    # a JSON body is params only (read_frame's rule), served by Flask's view
    r = c.post("/v1/double", json={"fail": "client"})
    assert r.status_code == 400 and json.loads(r.data) == {"error": "bad x"}
    assert json.loads(c.get("/v1/other").data) == {"ok": True}
    assert c.get("/v1/double").status_code == 405
    assert c.get("/v1/nothing").status_code == 404


def test_the_timer_counts_both_paths():
    app, _ = make_app()
    timer = app.extensions["gnn_faas_timer"]
    fast, slow = Client(wsgi_app(app)), Client(app)
    for c in (fast, slow):
        post(c, {"x": np.ones(3, np.float32)})
        post(c, {"x": np.ones(3, np.float32)}, {"fail": "client"})
    assert timer.as_dict()["requests"] == 4 and timer.as_dict()["errors"] == 2


def test_405_names_the_allowed_methods_and_options_answers_204():
    app = install(Flask("methods"))
    app.add_url_rule("/r", "r", lambda: "x", methods=["GET"])
    frame_route(app, "/f", lambda t, p: {})
    c = Client(wsgi_app(app))
    r = c.delete("/r")
    assert r.status_code == 405 and json.loads(r.data)["error"]
    assert r.headers["Allow"] == "GET, HEAD, OPTIONS"
    r = c.get("/f")
    assert r.status_code == 405 and r.headers["Allow"] == "OPTIONS, POST"
    r = c.options("/f")
    assert (r.status_code, r.headers["Allow"], r.data) == (204, "OPTIONS, POST", b"")
    r = c.options("/nowhere")
    assert r.status_code == 404 and "no such path" in json.loads(r.data)["error"]


def test_a_callers_deadline_bounds_the_call(client):
    """The deadline a caller sends (X-Gnn-Faas-Deadline-Ms) is the handler's; a
    bad value leaves it without one."""
    from gnn_faas import deadline

    app = install(Flask("deadline"))
    seen: list = []
    frame_route(app, "/d", lambda t, p: seen.append(deadline.remaining()) or {})

    @app.post("/v")
    def view():
        seen.append(deadline.remaining())
        return "ok"

    c = Client(wsgi_app(app))
    body = encode_frame({})
    headers = {"Content-Type": FRAME_MIME, deadline.HEADER: "1500"}
    assert c.post("/d", data=body, headers=headers).status_code == 200
    assert c.post("/v", data=b"{}", headers={deadline.HEADER: "1500"}).status_code == 200
    for bad in ("nan", "-5", "inf", "x"):
        c.post("/d", data=body, headers={"Content-Type": FRAME_MIME, deadline.HEADER: bad})
    assert 0 < seen[0] <= 1.5 and 0 < seen[1] <= 1.5
    assert seen[2:] == [None] * 4
    assert deadline.remaining() is None  # nothing leaks out of the calls

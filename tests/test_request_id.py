"""W3C trace context as the request id: parsing by the spec's rules, child
spans for outgoing calls, one context per execution of shared requests."""

from __future__ import annotations

import logging
import threading

import pytest

from gnn_faas import request_id
from gnn_faas.request_id import TraceContext, parse_traceparent

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_parsed_field_by_field():
    ctx = parse_traceparent(VALID, "congo=t61rcWkgMzE")
    assert ctx == TraceContext(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "01", "congo=t61rcWkgMzE"
    )
    assert ctx.traceparent == VALID
    assert ctx.headers() == {"traceparent": VALID, "tracestate": "congo=t61rcWkgMzE"}
    # a later version may append fields after a dash; it is read as version 00
    later = parse_traceparent("cc" + VALID[2:] + "-what-the-future-holds")
    assert later is not None and later.trace_id == ctx.trace_id


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # hex must be lowercase
        "ff" + VALID[2:],  # version ff is invalid
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # all-zero parent id
        VALID + "-extra",  # version 00 is exactly 55 characters
        "cc" + VALID[2:] + "x",  # a later version's extra fields start with a dash
        VALID[:-1],
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
    ],
)
def test_invalid_traceparents_are_refused(value):
    assert parse_traceparent(value) is None


def test_an_oversized_tracestate_is_dropped_not_truncated():
    ctx = parse_traceparent(VALID, "a=" + "x" * 600)
    assert ctx is not None and ctx.state == ""


def test_outgoing_calls_carry_a_child_span_of_the_current_request():
    assert request_id.outgoing_headers() == {}
    ctx = parse_traceparent(VALID)
    with request_id.bound(ctx):
        assert request_id.current_request_id() == ctx.trace_id
        one, two = (parse_traceparent(request_id.outgoing_headers()["traceparent"]) for _ in "12")
        assert one.trace_id == two.trace_id == ctx.trace_id
        assert len({one.span_id, two.span_id, ctx.span_id}) == 3
        assert one.flags == "01"
    assert request_id.current() is None  # the block leaves no context behind


def test_traced_binds_the_context_in_another_thread():
    ctx = request_id.new_trace()
    seen = []
    t = threading.Thread(target=request_id.traced(ctx, lambda: seen.append(request_id.current())))
    t.start()
    t.join()
    assert seen == [ctx]


def test_an_execution_keeps_a_lone_trace_and_links_several(caplog):
    a, b = request_id.new_trace(), request_id.new_trace()
    one = request_id.for_execution([a, a.child()])
    assert one.trace_id == a.trace_id and one.span_id != a.span_id
    with caplog.at_level(logging.INFO, logger="gnn_faas.request_id"):
        shared = request_id.for_execution([a, None, b])
    assert shared.trace_id not in (a.trace_id, b.trace_id)
    (record,) = [r for r in caplog.records if r.name == "gnn_faas.request_id"]
    assert record.links == [a.trace_id, b.trace_id]
    assert "2 requests" in record.getMessage()
    # requests without any id still run under a fresh trace of their own
    assert len(request_id.for_execution([None]).trace_id) == 32
